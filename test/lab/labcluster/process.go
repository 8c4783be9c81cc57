package labcluster

import "github.com/carve-net/carve/test/lab/proclab"

// StopTimeout is how long Stop waits after SIGTERM before it sends SIGKILL.
const StopTimeout = proclab.StopTimeout

// Process is one `carve master`, `carve agent` or rogue child of the
// cluster, supervised by proclab.
type Process = proclab.Process
