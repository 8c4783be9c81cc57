package mesh_test

import "testing"

func TestGobTCPSenderReceiver(t *testing.T) {
	t.Skip("TODO")
}

func TestLengthPrefixTCPSenderReceiver(t *testing.T) {
	t.Skip("TODO")
}

func TestEncryptedTCPSenderReceiver(t *testing.T) {
	t.Skip("TODO")
}
