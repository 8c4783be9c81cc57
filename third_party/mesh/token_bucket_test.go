package mesh_test

import "testing"

func TestTokenBucket(t *testing.T) {
	t.Skip("TODO")
}
