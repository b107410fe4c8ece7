package coord

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestEtcdClientLogsToSlog: the etcd client's warnings reach the
// coordinator's logger (at Debug, with their fields), its info lines do not,
// and nothing is written elsewhere.
func TestEtcdClientLogsToSlog(t *testing.T) {
	var buf bytes.Buffer
	log := slogZap(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	log.Info("chatty")
	log.With(zap.String("target", "etcd-endpoints://x")).Warn("retrying of unary invoker failed", zap.Int("attempt", 2))
	out := buf.String()
	for _, want := range []string{"retrying of unary invoker failed", "target=etcd-endpoints://x", "attempt=2", "level=DEBUG", "component=etcd-client"} {
		if !strings.Contains(out, want) {
			t.Errorf("the slog line %q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "chatty") {
		t.Errorf("an info line of the client was logged: %q", out)
	}
}
