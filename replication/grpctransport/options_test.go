package grpctransport

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDialerAndServerOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  func() error
		bad  []string
	}{
		{"dialer zero", func() error { return (&DialerOptions{Insecure: true}).EnsureDefaults().Validate() }, nil},
		{"server zero", func() error { return (&ServerOptions{Insecure: true}).EnsureDefaults().Validate() }, nil},
		{"dialer all at once", func() error {
			return (&DialerOptions{ConnectTimeout: -time.Second, KeepaliveTime: -1, KeepaliveTimeout: -1, RecvBuffer: -1,
				MaxBatchSize: MaxBatchFrame}).EnsureDefaults().Validate()
		}, []string{"ConnectTimeout", "KeepaliveTime", "KeepaliveTimeout", "RecvBuffer", "MaxBatchSize", "TLS"}},
		{"server all at once", func() error {
			return (&ServerOptions{SendBuffer: -1, HelloTimeout: -1, KeepaliveTime: -1, KeepaliveTimeout: -1}).EnsureDefaults().Validate()
		}, []string{"SendBuffer", "HelloTimeout", "KeepaliveTime", "KeepaliveTimeout", "TLS"}},
		{"NewDialer refuses", func() error {
			_, err := NewDialer("127.0.0.1:1", &DialerOptions{Insecure: true, RecvBuffer: -4})
			return err
		}, []string{"RecvBuffer"}},
		{"Listen refuses before binding", func() error {
			_, err := Listen("127.0.0.1:0", &ServerOptions{Insecure: true, SendBuffer: -8})
			return err
		}, []string{"SendBuffer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			if tc.bad == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrBadOptions) {
				t.Fatalf("%v, want ErrBadOptions", err)
			}
			for _, f := range tc.bad {
				if !strings.Contains(err.Error(), f) {
					t.Errorf("%v does not name %s", err, f)
				}
			}
		})
	}
}
