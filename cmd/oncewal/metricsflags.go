package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/oncewal/oncewal/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metricsFlags are --metrics-addr and, for a follower, --ready-max-lag.
type metricsFlags struct {
	addr   *string
	maxLag *time.Duration
}

func addMetricsFlags(fs *flag.FlagSet, follower bool) *metricsFlags {
	m := &metricsFlags{addr: fs.String("metrics-addr", "", "serve /metrics (Prometheus), /healthz and /readyz over HTTP on this host:port (empty: off)")}
	if follower {
		m.maxLag = fs.Duration("ready-max-lag", 30*time.Second,
			"/readyz: most a shard may lag the leader on the WAL clock while batches arrive (0: no lag check)")
	}
	return m
}

func (m *metricsFlags) check(c *flagCheck) {
	if *m.addr != "" {
		hostPort(c, "metrics-addr", *m.addr, false)
	}
	if m.maxLag != nil {
		atLeast(c, "ready-max-lag", *m.maxLag, 0)
	}
}

// serveMetrics serves metrics.Handler for cs (with the Go runtime and
// process collectors) on addr until stop; bound is the address listened on.
// An empty addr serves nothing.
func serveMetrics(addr string, log *slog.Logger, ready func() error, cs ...prometheus.Collector) (bound string, stop func(), err error) {
	if addr == "" {
		return "", func() {}, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(cs...)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: metrics.Handler(reg, ready), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("oncewal: metrics server stopped", "err", err)
		}
	}()
	bound = lis.Addr().String()
	log.Info("oncewal: serving metrics", "addr", bound, "paths", "/metrics /healthz /readyz")
	return bound, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
