package containerdlab

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
)

// PauseImage is the sandbox image of every pod (the CRI plugin's
// sandbox_image): busybox's sleep, for ever. It is built here and imported
// with ctr, as no registry is reachable from a lab.
const PauseImage = "carve.invalid/pause:lab"

// Snapshotter is the snapshotter of the CRI plugin and of the import.
const Snapshotter = "native"

// blob is one content-addressed file of an OCI image layout.
type blob struct {
	mediaType string
	data      []byte
}

func (b blob) digest() string {
	sum := sha256.Sum256(b.data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (b blob) descriptor() map[string]any {
	return map[string]any{"mediaType": b.mediaType, "digest": b.digest(), "size": len(b.data)}
}

// pauseArchive returns an OCI image layout, as a tar, of one image named
// PauseImage: the layer (an uncompressed tar of the root file system) and
// an entrypoint that sleeps for ever. `ctr images import` reads it.
func pauseArchive(layer []byte) ([]byte, error) {
	return imageArchive(PauseImage, layer, map[string]any{
		"Entrypoint": []string{"/bin/sleep", "2147483647"},
		"WorkingDir": "/",
	})
}

// imageArchive returns an OCI image layout, as a tar, of one image named
// name (a full reference, e.g. registry.k8s.io/e2e-test-images/busybox:1.29-2)
// of one layer (an uncompressed tar of the root file system) and the image
// config's config (Entrypoint, Cmd, WorkingDir...). `ctr images import`
// reads it.
func imageArchive(name string, layer []byte, config map[string]any) ([]byte, error) {
	l := blob{"application/vnd.oci.image.layer.v1.tar", layer}
	cfg, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       config,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{l.digest()}},
	})
	if err != nil {
		return nil, err
	}
	c := blob{"application/vnd.oci.image.config.v1+json", cfg}
	man, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        c.descriptor(),
		"layers":        []any{l.descriptor()},
	})
	if err != nil {
		return nil, err
	}
	m := blob{"application/vnd.oci.image.manifest.v1+json", man}
	md := m.descriptor()
	md["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	// ctr names the image after io.containerd.image.name.
	md["annotations"] = map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": refName(name)}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{md},
	})
	if err != nil {
		return nil, err
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
	}
	for _, b := range []blob{l, c, m} {
		files = append(files, struct {
			name string
			data []byte
		}{"blobs/sha256/" + b.digest()[len("sha256:"):], b.data})
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f.data))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("write %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// refName is the tag of a reference (org.opencontainers.image.ref.name),
// "latest" when it has none.
func refName(name string) string {
	i := strings.LastIndexByte(name, ':')
	if i < 0 || strings.Contains(name[i:], "/") {
		return "latest"
	}
	return name[i+1:]
}
