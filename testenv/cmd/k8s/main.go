// Command k8s is a multi-call binary holding the parts of a Kubernetes
// control plane that the test environment runs on loopback: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and kubectl.
//
// Usage: k8s <component> [flags...], or through a link named after the
// component (kubectl -> k8s), so the binary can stand in for kubectl on PATH.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler": func() *cobra.Command {
		return scheduler.NewSchedulerCommand()
	},
	"kubectl": kubectlcmd.NewDefaultKubectlCommand,
	"etcd":    newEtcdCommand,
}

func main() {
	if newCommand, ok := components[filepath.Base(os.Args[0])]; ok {
		command := newCommand()
		command.SetArgs(os.Args[1:])
		os.Exit(cli.Run(command))
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: k8s <etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl> [flags...]")
		os.Exit(2)
	}
	newCommand, ok := components[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "k8s: unknown component %q\n", os.Args[1])
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(os.Args[2:])
	os.Exit(cli.Run(command))
}
