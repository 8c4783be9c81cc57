package atomicfile

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// putsFilesInPlace are the calls of the standard library that write a file
// into place or move one there. Outside this package, a file of the shipped
// tree that matters goes through Write, WriteNew or Remove instead, which
// fsync the file and its directory: a rename without the directory fsync
// can lose the new name at a power loss (a WireGuard key the masters signed
// whose private half is gone), and a file written in place can be found
// half written.
var putsFilesInPlace = map[string][]string{
	"os":        {"Rename", "Link", "WriteFile", "Create", "CreateTemp"},
	"io/ioutil": {"WriteFile", "TempFile"},
}

// strayAllowed names the files of the shipped tree that may still call
// them, each with why.
var strayAllowed = map[string]string{
	"internal/atomicfile/atomicfile.go": "the helper itself",
	"internal/unixsock/unixsock.go": "moves a listening socket, made in a private directory, to its path: a socket holds no data " +
		"to lose, and the agent makes it again at every start",
	"master/health.go": "the data dir probe writes, syncs and removes a scratch file: it tests the raw write path a full disk " +
		"breaks, and holds nothing to keep",
}

// notShipped are the roots of what does not ship: the lab, the tests and
// the vendored copies are not held to the rule.
var notShipped = []string{"test/", "third_party/", "bin/"}

// TestNoStrayFileWrites fails on a call that puts a file in place outside
// this package (os.Rename, os.Link, os.WriteFile, os.Create, os.CreateTemp,
// os.OpenFile with O_CREATE, their io/ioutil forms) in the non-test code of
// the shipped tree, unless strayAllowed names its file with a reason.
func TestNoStrayFileWrites(t *testing.T) {
	root := moduleRoot(t)
	var stray []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || shippedNot(rel+"/")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		if _, ok := strayAllowed[rel]; ok {
			return nil
		}
		calls, err := fileWrites(path)
		if err != nil {
			return err
		}
		for _, c := range calls {
			stray = append(stray, rel+":"+c)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(stray)
	for _, s := range stray {
		t.Errorf("%s: put the file in place with internal/atomicfile (Write, WriteNew, Remove), "+
			"or name the file in strayAllowed with why it need not be durable", s)
	}
	for rel := range strayAllowed {
		if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
			t.Errorf("strayAllowed names %s: %v (drop the entry)", rel, err)
		}
	}
}

// TestStrayFileWritesAreFound checks the finder itself on a file with one
// call of each kind it must catch, and calls it must let be.
func TestStrayFileWritesAreFound(t *testing.T) {
	src := `package p

import (
	xos "os"
	"io/ioutil"
)

func f() {
	xos.Rename("a", "b")
	xos.WriteFile("a", nil, 0)
	xos.OpenFile("a", xos.O_RDWR|xos.O_CREATE, 0)
	xos.OpenFile("a", xos.O_RDONLY, 0)
	ioutil.WriteFile("a", nil, 0)
	xos.ReadFile("a")
}
`
	path := filepath.Join(t.TempDir(), "p.go")
	if err := Write(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := fileWrites(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"9: os.Rename", "10: os.WriteFile", "11: os.OpenFile with O_CREATE", "13: io/ioutil.WriteFile"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("found %q, want %q", got, want)
	}
}

func shippedNot(rel string) bool {
	for _, p := range notShipped {
		if strings.HasPrefix(rel, p) {
			return true
		}
	}
	return false
}

// fileWrites lists the calls in a Go file that put a file in place, as
// "LINE: PACKAGE.FUNC".
func fileWrites(path string) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	// The names the file gives the packages of putsFilesInPlace.
	names := map[string]string{}
	for _, imp := range f.Imports {
		p, err := strconv.Unquote(imp.Path.Value)
		if err != nil || putsFilesInPlace[p] == nil {
			continue
		}
		name := filepath.Base(p)
		if imp.Name != nil {
			name = imp.Name.Name
		}
		names[name] = p
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		pkg, fn, ok := selector(call.Fun)
		if !ok || names[pkg] == "" {
			return true
		}
		line := strconv.Itoa(fset.Position(call.Pos()).Line) + ": " + names[pkg] + "." + fn
		for _, bad := range putsFilesInPlace[names[pkg]] {
			if fn == bad {
				out = append(out, line)
			}
		}
		if names[pkg] == "os" && fn == "OpenFile" && len(call.Args) > 1 && mentions(call.Args[1], pkg, "O_CREATE") {
			out = append(out, line+" with O_CREATE")
		}
		return true
	})
	return out, nil
}

// selector splits pkg.Fn.
func selector(e ast.Expr) (pkg, fn string, ok bool) {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return "", "", false
	}
	id, ok := sel.X.(*ast.Ident)
	if !ok {
		return "", "", false
	}
	return id.Name, sel.Sel.Name, true
}

// mentions tells whether expression e names pkg.name.
func mentions(e ast.Expr, pkg, name string) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if x, ok := n.(ast.Expr); ok {
			if p, f, ok := selector(x); ok && p == pkg && f == name {
				found = true
			}
		}
		return !found
	})
	return found
}

// moduleRoot is the directory of carve's go.mod, above this package's.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/carve-net/carve\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod of github.com/carve-net/carve above the test's directory")
		}
		dir = parent
	}
}
