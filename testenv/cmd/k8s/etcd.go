package main

import (
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/embed"
)

// newEtcdCommand runs a single-member etcd embedded from the server module
// that k8s.io/kubernetes itself depends on, so the API server talks to the
// etcd version it was released with.
func newEtcdCommand() *cobra.Command {
	var dataDir, clientURL, peerURL string
	var fsync bool
	command := &cobra.Command{
		Use:          "etcd",
		Short:        "Run a single-member etcd on the given URLs",
		SilenceUsage: true,
		RunE: func(*cobra.Command, []string) error {
			client, err := url.Parse(clientURL)
			if err != nil {
				return fmt.Errorf("--listen-client-urls: %w", err)
			}
			peer, err := url.Parse(peerURL)
			if err != nil {
				return fmt.Errorf("--listen-peer-urls: %w", err)
			}
			cfg := embed.NewConfig()
			cfg.Name = "default"
			cfg.Dir = dataDir
			cfg.ListenClientUrls = []url.URL{*client}
			cfg.AdvertiseClientUrls = []url.URL{*client}
			cfg.ListenPeerUrls = []url.URL{*peer}
			cfg.AdvertisePeerUrls = []url.URL{*peer}
			cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
			cfg.LogLevel = "warn"
			// A throwaway test cluster does not need durable writes; skipping
			// fsync keeps the API server's write latency low on shared disks.
			cfg.UnsafeNoFsync = !fsync
			server, err := embed.StartEtcd(cfg)
			if err != nil {
				return err
			}
			defer server.Close()
			select {
			case <-server.Server.ReadyNotify():
			case <-time.After(60 * time.Second):
				return fmt.Errorf("etcd did not become ready within 60s")
			}
			fmt.Fprintf(os.Stderr, "etcd ready on %s\n", client)
			signals := make(chan os.Signal, 1)
			signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
			select {
			case sig := <-signals:
				fmt.Fprintf(os.Stderr, "etcd stopping on %s\n", sig)
				return nil
			case err := <-server.Err():
				return err
			}
		},
	}
	command.Flags().StringVar(&dataDir, "data-dir", "etcd-data", "directory for etcd's data")
	command.Flags().StringVar(&clientURL, "listen-client-urls", "http://127.0.0.1:2379", "client URL to listen on")
	command.Flags().StringVar(&peerURL, "listen-peer-urls", "http://127.0.0.1:2380", "peer URL to listen on")
	command.Flags().BoolVar(&fsync, "fsync", false, "fsync writes (off by default for test clusters)")
	return command
}
