package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/carve-net/carve/internal/cli"
)

func TestRunRefusesBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--hosts", "0"}, "--hosts 0: want 1-50"},
		{[]string{"--hosts", "51"}, "--hosts 51: want 1-50"},
		{[]string{"--containers", "-1"}, "--containers -1: want 0-50"},
		{[]string{"--containers", "51"}, "--containers 51: want 0-50"},
	}
	for _, tc := range tests {
		err := run(context.Background(), tc.args)
		if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v; want a usage error with %q", tc.args, err, tc.want)
		}
	}
}
