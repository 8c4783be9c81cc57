package labcluster

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/carve-net/carve/internal/retry"
)

// MetricSample reads one sample of the /metrics of the server at base (an
// agent's or a master's URL): name with its labels as the text format
// writes them (`x_total{reason="unsigned"}`). A missing sample is a
// permanent error (retry.Permanent).
func MetricSample(ctx context.Context, hc *http.Client, base, sample string) (float64, error) {
	var v float64
	found := false
	err := scanMetrics(ctx, hc, base, func(line string) error {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok && !found {
			f, err := strconv.ParseFloat(rest, 64)
			v, found = f, true
			return err
		}
		return nil
	})
	if err == nil && !found {
		err = retry.Permanent(fmt.Errorf("%s has no sample %s", base, sample))
	}
	return v, err
}

// MetricSum is the sum of every sample of the metric name (all its
// labels) at base; 0 when it has none.
func MetricSum(ctx context.Context, hc *http.Client, base, name string) (float64, error) {
	var sum float64
	err := scanMetrics(ctx, hc, base, func(line string) error {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			return nil
		}
		f, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
		sum += f
		return err
	})
	return sum, err
}

// scanMetrics hands each line of base's /metrics to line.
func scanMetrics(ctx context.Context, hc *http.Client, base string, line func(string) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if err := line(sc.Text()); err != nil {
			return err
		}
	}
	return sc.Err()
}
