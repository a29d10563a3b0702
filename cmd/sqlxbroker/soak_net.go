package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"

	"github.com/go-sql-driver/mysql"
	"github.com/sqlxbroker/sqlxbroker/conformance"
)

// soakProxy is the faulty network between the soak's workers and the
// server: a TCP proxy on a loopback port whose connections to the server
// go through a conformance.Network, so the harness can stall (no byte
// crosses either way; the server sees nothing) and cut (every connection
// closed: the server ends their sessions) all worker traffic at once. The
// harness's own connection does not go through it.
type soakProxy struct {
	ln       net.Listener
	net      *conformance.Network
	upstream string
	wg       sync.WaitGroup
}

// proxyDSN returns dsn with its server address replaced by addr, and the
// address replaced. PostgreSQL: a postgres:// URL; MySQL: a tcp(...)
// address.
func proxyDSN(driver, dsn, addr string) (proxied, upstream string, err error) {
	switch driver {
	case "postgres":
		u, err := url.Parse(dsn)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" || u.Hostname() == "" {
			return "", "", errors.New("soak: --net-fault-every needs a postgres:// URL DSN with a host")
		}
		upstream = u.Host
		if u.Port() == "" {
			upstream = net.JoinHostPort(u.Hostname(), "5432")
		}
		u.Host = addr
		return u.String(), upstream, nil
	case "mysql":
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil || cfg.Net != "tcp" {
			return "", "", errors.New("soak: --net-fault-every needs a MySQL DSN with a tcp(host:port) address")
		}
		upstream, cfg.Addr = cfg.Addr, addr
		return cfg.FormatDSN(), upstream, nil
	}
	return "", "", fmt.Errorf("soak: --net-fault-every: %s has no network to fault", driver)
}

// startSoakProxy listens on a loopback port for connections to upstream.
func startSoakProxy(upstream string) (*soakProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &soakProxy{ln: ln, net: conformance.NewNetwork(), upstream: upstream}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *soakProxy) addr() string { return p.ln.Addr().String() }

func (p *soakProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

// pipe copies between a worker's connection and its server connection
// until either ends, then closes both.
func (p *soakProxy) pipe(c net.Conn) {
	defer c.Close()
	u, err := p.net.Dial(context.Background(), "tcp", p.upstream)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
	<-done
}

// close stops the proxy and cuts what is left.
func (p *soakProxy) close() {
	p.net.Resume()
	p.ln.Close()
	p.wg.Wait()
	p.net.Cut()
}
