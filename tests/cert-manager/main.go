// Command cert-manager-controller runs cert-manager's own controllers for Certificates,
// Issuers and ClusterIssuers with the CA and self-signed issuers, out of cluster, against
// the API server named by --kubeconfig. cert-manager's command module (cmd/controller)
// is not on the Go module proxy; its controllers (pkg/controller) are, and this starts
// them the way that command does, without leader election, ACME, Vault, Venafi, the
// ingress and Gateway shims and the metrics server.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server to serve")
	clusterNamespace := flag.String("cluster-resource-namespace", "cert-manager", "namespace of ClusterIssuers' Secrets")
	flag.Parse()
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "cert-manager-controller: --kubeconfig is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *kubeconfig, *clusterNamespace); err != nil {
		fmt.Fprintln(os.Stderr, "cert-manager-controller:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, clusterNamespace string) error {
	ctx = logf.NewContext(ctx, logf.Log)
	factory, err := controllerpkg.NewContextFactory(ctx, controllerpkg.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   50,
		KubernetesAPIBurst: 100,
		IssuerOptions:      controllerpkg.IssuerOptions{ClusterResourceNamespace: clusterNamespace},
		CertificateOptions: controllerpkg.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: time.Second,
			CertificateRequestMaximumBackoffDuration: time.Minute,
		},
	})
	if err != nil {
		return err
	}
	known := controllerpkg.Known()
	names := make([]string, 0, len(known))
	for name := range known {
		names = append(names, name)
	}
	sort.Strings(names)
	var loops []controllerpkg.Interface
	for _, name := range names {
		loop, err := known[name](factory)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		loops = append(loops, loop)
	}
	shared, err := factory.Build()
	if err != nil {
		return err
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())
	fmt.Fprintf(os.Stderr, "cert-manager-controller: running %v\n", names)
	var wg sync.WaitGroup
	errs := make(chan error, len(loops))
	for i, loop := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := loop.Run(5, ctx); err != nil {
				errs <- fmt.Errorf("%s: %w", names[i], err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
