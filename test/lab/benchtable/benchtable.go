// Package benchtable prints benchmark results as a table in which every figure
// stands beside a baseline measured in the same run, so that the ratio (which
// holds on a noisy machine) is what a reader compares, not absolute times.
package benchtable

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Row is one measured figure and the baseline it is judged against.
type Row struct {
	Name     string  // what was measured, e.g. "register, 64 clients"
	Value    float64 // the figure
	Unit     string  // e.g. "ops/s", "µs/op"
	Baseline string  // what the baseline is, e.g. "fsync/s of the same disk"
	BaseVal  float64 // the baseline's figure, in the same unit
	// HigherIsBetter tells how to read the ratio column (Value/BaseVal).
	HigherIsBetter bool
	// BaseNA says the baseline could not be measured (Baseline says why):
	// its value prints as "n/a" instead of a misleading 0.
	BaseNA bool
	Note   string // optional remark (target, parameters)
}

// Table is a titled list of rows.
type Table struct {
	Title string
	Rows  []Row
}

// Add appends a row.
func (t *Table) Add(r Row) { t.Rows = append(t.Rows, r) }

// Print writes the table in aligned columns.
func (t *Table) Print(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "\n== %s ==\n", t.Title); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "benchmark\tvalue\tbaseline\tbaseline value\tratio\tnote")
	for _, r := range t.Rows {
		ratio, base := "-", Format(r.BaseVal)+" "+r.Unit
		if r.BaseNA {
			base = "n/a"
		} else if r.BaseVal != 0 {
			dir := "lower is better"
			if r.HigherIsBetter {
				dir = "higher is better"
			}
			ratio = fmt.Sprintf("%.2fx (%s)", r.Value/r.BaseVal, dir)
		}
		fmt.Fprintf(tw, "%s\t%s %s\t%s\t%s\t%s\t%s\n",
			r.Name, Format(r.Value), r.Unit, r.Baseline, base, ratio, r.Note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, strings.Repeat("-", 20))
	return err
}

// Format renders a figure with a sensible number of digits.
func Format(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.4f", v)
	}
}
