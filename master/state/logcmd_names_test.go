package state

import "github.com/carve-net/carve/master/logcmd"

// The table's tests write log entries by hand with these names, as they
// did before the commands moved to package logcmd (issue 30): the
// determinism test's random logs and the tests of each rule are unchanged.
type (
	command     = logcmd.Command
	registerCmd = logcmd.Register
	deleteCmd   = logcmd.Delete
	compactCmd  = logcmd.Compact
	reportCmd   = logcmd.Report
	growCmd     = logcmd.Grow
	returnCmd   = logcmd.Return
	grantCmd    = logcmd.Grant
	releaseCmd  = logcmd.Release
	holdingsAck = logcmd.HoldingsAck
	revokeCmd   = logcmd.Revoke
	restoreCmd  = logcmd.Restore
)

const (
	opRegister     = logcmd.OpRegister
	opDelete       = logcmd.OpDelete
	opSetConfig    = logcmd.OpSetConfig
	opServerMeta   = logcmd.OpServerMeta
	opSetClusterID = logcmd.OpSetClusterID
	opCompact      = logcmd.OpCompact
	opReport       = logcmd.OpReport
	opGrow         = logcmd.OpGrow
	opReturn       = logcmd.OpReturn
	opGrant        = logcmd.OpGrant
	opRelease      = logcmd.OpRelease
	opRevoke       = logcmd.OpRevoke
	opRestore      = logcmd.OpRestore
)

// encodeCommand is c as a log entry.
func encodeCommand(c command) ([]byte, error) { return c.Encode() }
