package coord

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogZap is the etcd client's logger: its warnings and errors go to the
// coordinator's slog.Logger (at Debug: the client retries on its own and
// the coordinator reports what matters — ErrUnavailable, a lost lease —
// itself), not as JSON lines on stderr beside the process's own log.
func slogZap(log *slog.Logger) *zap.Logger {
	return zap.New(&slogCore{log: log.With("component", "etcd-client")})
}

type slogCore struct {
	log    *slog.Logger
	fields []zapcore.Field
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= zapcore.WarnLevel }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, fields: append(append([]zapcore.Field(nil), c.fields...), fields...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(append([]zapcore.Field(nil), c.fields...), fields...) {
		f.AddTo(enc)
	}
	attrs := make([]any, 0, 2*len(enc.Fields))
	for k, v := range enc.Fields {
		attrs = append(attrs, k, v)
	}
	c.log.Log(context.Background(), slog.LevelDebug, e.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }
