package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/sqlxbroker/sqlxbroker/dashboard"
)

const serveUsage = `usage: sqlxbroker serve --driver NAME --dsn DSN (--table NAME [columns] | --tables FILE) [flags]

Serves the web dashboard of the described tables: their counts, refreshing,
and pages of their rows by state with attempt and last error. It is
read-only unless --actions is given (requeue and delete, as POST forms with
a CSRF token). It listens on 127.0.0.1:8080 by default; it has no
authentication of its own, so put it behind your own before listening on
another address. It runs until SIGINT or SIGTERM.

`

func serveCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var addr string
	var actions bool
	var refresh time.Duration
	o := newOpsFlags("serve", serveUsage, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on")
		fs.BoolVar(&actions, "actions", false, "enable requeue and delete (read-only without)")
		fs.DurationVar(&refresh, "refresh", 2*time.Second, "how often the page refreshes its counts")
	})
	if err := o.parse(args); err != nil {
		return helpOK(err)
	}
	b, tables, closeFn, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	h, err := dashboard.New(b, dashboard.Options{Tables: tables, Actions: actions, Refresh: refresh})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	mode := "read-only"
	if actions {
		mode = "actions enabled"
	}
	fmt.Fprintf(stdout, "sqlxbroker dashboard on http://%s/ (%s, %d tables)\n", ln.Addr(), mode, len(tables))
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
