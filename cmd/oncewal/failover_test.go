package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDemoFailover(t *testing.T) {
	defer func(n int) { failoverSeeds = n }(failoverSeeds)
	failoverSeeds = 2
	var out, errb bytes.Buffer
	require.Equal(t, 0, runDemo([]string{"--failover", "--json", "--seed", "7", "--dir", t.TempDir()}, &out, &errb), errb.String())
	var rep failoverReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	require.True(t, rep.Verified)
	require.Len(t, rep.Runs, 6)
	for _, r := range rep.Runs {
		require.True(t, r.Fenced)
		require.Empty(t, r.Error)
	}
	out.Reset()
	require.Equal(t, 0, runDemo([]string{"--failover", "--seed", "3"}, &out, &errb), errb.String())
	require.Contains(t, out.String(), "VERIFIED")
	require.True(t, strings.Contains(out.String(), "promoted with epoch 2"))
}
