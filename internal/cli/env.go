package cli

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"
)

// EnvPrefix starts the name of every flag's environment variable.
const EnvPrefix = "CARVE_"

// EnvName is the environment variable of a daemon's flag: CARVE_ and the
// flag's name in capitals, '-' as '_' (--resync-interval:
// CARVE_RESYNC_INTERVAL).
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ParseEnv parses args like Parse, then sets every flag that args did not
// give from its variable (EnvName) in env, the process environment as
// os.Environ returns it. An empty or absent variable leaves the flag's
// default: systemd passes a variable an env file leaves empty as "".
// Flags in noEnv have no variable. A bad value is a usage error naming the
// variable. It returns the variables it used, by flag name, and the CARVE_
// variables in env that are no flag's (a misspelt name, for a warning).
func ParseEnv(fs *flag.FlagSet, args, env []string, noEnv ...string) (used map[string]string, unknown []string, err error) {
	if err := Parse(fs, args); err != nil {
		return nil, nil, err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, EnvPrefix) {
			vars[k] = v
		}
	}
	known := map[string]bool{}
	used = map[string]string{}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if slices.Contains(noEnv, f.Name) {
			return
		}
		name := EnvName(f.Name)
		known[name] = true
		value := vars[name]
		if given[f.Name] || value == "" {
			return
		}
		if err := fs.Set(f.Name, value); err != nil {
			errs = append(errs, fmt.Errorf("%s: invalid %s %q (for --%s): %v", name, kind(f), value, f.Name, err))
			return
		}
		used[f.Name] = name
	})
	if len(errs) > 0 {
		return nil, nil, fmt.Errorf("%w: %w", ErrUsage, errors.Join(errs...))
	}
	for k := range vars {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	return used, unknown, nil
}

// kind names the type of value a flag wants, for an error.
func kind(f *flag.Flag) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return "value"
	}
	switch g.Get().(type) {
	case time.Duration:
		return "duration (like 30s or 5m)"
	case bool:
		return "boolean (true or false)"
	case int, int64, uint, uint64:
		return "integer"
	default:
		return "value"
	}
}

// NameSource appends to err, for each flag of fs it mentions (--name),
// the variable that set it (used, as ParseEnv returned it) or else the
// variable that can: an operator who writes env files reads
// "--resync-interval 500ms: at least 1s (set by CARVE_RESYNC_INTERVAL)" and
// "--masters is required (or CARVE_MASTERS)".
// Flags in noEnv have no variable.
func NameSource(err error, fs *flag.FlagSet, used map[string]string, noEnv ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var notes []string
	fs.VisitAll(func(f *flag.Flag) {
		switch v, ok := used[f.Name]; {
		case !mentions(msg, "--"+f.Name) || slices.Contains(noEnv, f.Name):
		case ok:
			notes = append(notes, "set by "+v)
		default:
			notes = append(notes, "or "+EnvName(f.Name))
		}
	})
	if len(notes) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(notes, "; "))
}

// mentions reports whether msg names the flag (not merely a longer flag
// that starts with its name).
func mentions(msg, flagName string) bool {
	for rest := msg; ; {
		i := strings.Index(rest, flagName)
		if i < 0 {
			return false
		}
		rest = rest[i+len(flagName):]
		if rest == "" || !(rest[0] == '-' || rest[0] >= 'a' && rest[0] <= 'z' || rest[0] >= '0' && rest[0] <= '9') {
			return true
		}
	}
}
