//go:build tools

// This file is never built (the tools tag): it holds in go.mod and go.sum
// the packages critest is linked from, at the cri-tools version go.mod
// pins for crictl. critest is the test binary of
// sigs.k8s.io/cri-tools/cmd/critest (it has no non-test Go files, so a
// tool directive cannot build it); TestCritest builds it with
// `go test -c`, which needs them.
package e2e

import (
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/ginkgo/v2/types"
	_ "github.com/onsi/gomega"
	_ "sigs.k8s.io/cri-tools/pkg/benchmark"
	_ "sigs.k8s.io/cri-tools/pkg/common"
	_ "sigs.k8s.io/cri-tools/pkg/framework"
	_ "sigs.k8s.io/cri-tools/pkg/validate"
	_ "sigs.k8s.io/cri-tools/pkg/version"
)
