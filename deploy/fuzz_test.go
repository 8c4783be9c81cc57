package deploy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFuzzScriptFindsEveryTarget: fuzz.sh (make fuzz) lists exactly the fuzz
// targets Go's parser finds in the tree's test files, each with its package
// directory, so that no target is left out of make fuzz.
func TestFuzzScriptFindsEveryTarget(t *testing.T) {
	out, err := exec.Command("./fuzz.sh", "-list").CombinedOutput()
	if err != nil {
		t.Fatalf("fuzz.sh -list: %v\n%s", err, out)
	}
	var listed []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("fuzz.sh -list: line %q is not \"module package name\"", line)
		}
		listed = append(listed, filepath.Join(f[0], f[1])+" "+f[2])
	}
	slices.Sort(listed)

	found := parsedFuzzTargets(t, "..")
	if len(found) == 0 {
		t.Fatal("no fuzz target in the tree: the walk is wrong")
	}
	if !slices.Equal(listed, found) {
		t.Fatalf("fuzz.sh lists\n%s\nthe parser finds\n%s", strings.Join(listed, "\n"), strings.Join(found, "\n"))
	}
}

// parsedFuzzTargets returns "dir Name" (dir relative to root) for every
// func FuzzXxx(*testing.F) in a _test.go file under root, sorted.
func parsedFuzzTargets(t *testing.T, root string) []string {
	t.Helper()
	var found []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (name == "testdata" || name == "bin" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, decl := range file.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && isFuzzTarget(fn) {
				found = append(found, rel+" "+fn.Name.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(found)
	return found
}

// isFuzzTarget is go test's rule: a function FuzzXxx (Xxx not starting with a
// lower-case letter) taking one *testing.F.
func isFuzzTarget(fn *ast.FuncDecl) bool {
	name := fn.Name.Name
	if fn.Recv != nil || !strings.HasPrefix(name, "Fuzz") {
		return false
	}
	if rest := name[len("Fuzz"):]; rest != "" && rest[0] >= 'a' && rest[0] <= 'z' {
		return false
	}
	params := fn.Type.Params.List
	if len(params) != 1 || len(params[0].Names) > 1 {
		return false
	}
	star, ok := params[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "F" && isIdent(sel.X, "testing")
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}
