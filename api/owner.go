package api

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Who holds an address: every allocation records the owner its runtime
// named, so that an operator can answer "which container has 10.0.3.7"
// (carve ipam show --ip, --owner) and the agent can take back the address
// of a container whose network namespace is gone (--reclaim-after).

// Runtimes an Owner comes from (Owner.Runtime).
const (
	RuntimeCNI    = "cni"
	RuntimeDocker = "docker"
)

// Bounds of an owner's fields: remote input, kept in every allocation record.
const (
	maxOwnerField = 256
	maxNetNSPath  = 1024
)

// Owner is the container an allocation belongs to, as its runtime gave it.
// Every field is optional: records written before owners were recorded
// have none.
type Owner struct {
	// Runtime is RuntimeCNI or RuntimeDocker.
	Runtime string `json:"runtime,omitempty"`
	// ContainerID is the runtime's container id (CNI_CONTAINERID; for
	// Docker, the container's id as the engine lists it).
	ContainerID string `json:"container_id,omitempty"`
	// IfName is the container's interface (CNI_IFNAME).
	IfName string `json:"ifname,omitempty"`
	// NetNS is the container's network namespace path (CNI_NETNS).
	NetNS string `json:"netns,omitempty"`
	// The Kubernetes identity of CNI_ARGS (containerd's CRI, CRI-O;
	// Podman sends its container name as K8S_POD_NAME, with no namespace).
	PodNamespace        string `json:"k8s_pod_namespace,omitempty"`
	PodName             string `json:"k8s_pod_name,omitempty"`
	PodUID              string `json:"k8s_pod_uid,omitempty"`
	PodInfraContainerID string `json:"k8s_pod_infra_container_id,omitempty"`
	// The Nomad identity of CNI_ARGS.
	NomadAllocID   string `json:"nomad_alloc_id,omitempty"`
	NomadJobID     string `json:"nomad_job_id,omitempty"`
	NomadGroup     string `json:"nomad_group_name,omitempty"`
	NomadNamespace string `json:"nomad_namespace,omitempty"`
	// Docker's endpoint id and container name (learnt from the engine: the
	// IPAM request carries neither) and the endpoint's MAC address.
	EndpointID    string `json:"endpoint_id,omitempty"`
	ContainerName string `json:"container_name,omitempty"`
	MAC           string `json:"mac,omitempty"`
}

// cniArgsFields maps the CNI_ARGS keys carve records to the owner's fields.
func (o *Owner) cniArgsFields() map[string]*string {
	return map[string]*string{
		"K8S_POD_NAMESPACE":          &o.PodNamespace,
		"K8S_POD_NAME":               &o.PodName,
		"K8S_POD_UID":                &o.PodUID,
		"K8S_POD_INFRA_CONTAINER_ID": &o.PodInfraContainerID,
		"NOMAD_ALLOC_ID":             &o.NomadAllocID,
		"NOMAD_JOB_ID":               &o.NomadJobID,
		"NOMAD_GROUP_NAME":           &o.NomadGroup,
		"NOMAD_NAMESPACE":            &o.NomadNamespace,
	}
}

// fields lists the owner's fields by their JSON name.
func (o *Owner) fields() []struct {
	name string
	v    *string
} {
	return []struct {
		name string
		v    *string
	}{
		{"runtime", &o.Runtime}, {"container_id", &o.ContainerID}, {"ifname", &o.IfName}, {"netns", &o.NetNS},
		{"k8s_pod_namespace", &o.PodNamespace}, {"k8s_pod_name", &o.PodName}, {"k8s_pod_uid", &o.PodUID},
		{"k8s_pod_infra_container_id", &o.PodInfraContainerID},
		{"nomad_alloc_id", &o.NomadAllocID}, {"nomad_job_id", &o.NomadJobID}, {"nomad_group_name", &o.NomadGroup},
		{"nomad_namespace", &o.NomadNamespace},
		{"endpoint_id", &o.EndpointID}, {"container_name", &o.ContainerName}, {"mac", &o.MAC},
	}
}

// ErrBadOwner marks an owner with a field too long or not printable.
var ErrBadOwner = errors.New("invalid owner")

// Validate checks every field: printable, without control characters,
// at most 256 bytes (the netns path: an absolute path of at most 1024).
func (o *Owner) Validate() error {
	if o == nil {
		return nil
	}
	for _, f := range o.fields() {
		limit := maxOwnerField
		if f.name == "netns" {
			limit = maxNetNSPath
		}
		if err := checkPrintable(*f.v, limit); err != nil {
			return fmt.Errorf("%w: owner.%s: %v", ErrBadOwner, f.name, err)
		}
	}
	if o.NetNS != "" && !strings.HasPrefix(o.NetNS, "/") {
		return fmt.Errorf("%w: owner.netns %q: want an absolute path", ErrBadOwner, o.NetNS)
	}
	return nil
}

// checkPrintable refuses text longer than limit bytes, or not UTF-8, or
// with a control or non-printable character.
func checkPrintable(s string, limit int) error {
	if len(s) > limit {
		return fmt.Errorf("%d bytes, at most %d", len(s), limit)
	}
	if !utf8.ValidString(s) {
		return errors.New("not UTF-8")
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("non-printable character %q", r)
		}
	}
	return nil
}

// Empty tells whether the owner says nothing.
func (o *Owner) Empty() bool {
	if o == nil {
		return true
	}
	for _, f := range o.fields() {
		if *f.v != "" {
			return false
		}
	}
	return true
}

// Matches tells whether text is a substring of any of the owner's fields
// (case-insensitive); an empty text matches every owner.
func (o *Owner) Matches(text string) bool {
	if text == "" {
		return true
	}
	if o == nil {
		return false
	}
	text = strings.ToLower(text)
	for _, f := range o.fields() {
		if strings.Contains(strings.ToLower(*f.v), text) {
			return true
		}
	}
	return false
}

// String names the owner for a person: its pod, Nomad allocation or
// Docker container first, then the container id, interface and netns.
func (o *Owner) String() string {
	if o.Empty() {
		return "an unknown container (recorded before carve kept owners)"
	}
	var parts []string
	switch {
	case o.PodName != "" && o.PodNamespace != "":
		parts = append(parts, "pod "+o.PodNamespace+"/"+o.PodName)
	case o.PodName != "":
		parts = append(parts, "container "+o.PodName) // Podman's name
	}
	if o.NomadAllocID != "" {
		s := "nomad alloc " + o.NomadAllocID
		if o.NomadJobID != "" {
			s += " (job " + o.NomadJobID
			if o.NomadGroup != "" {
				s += ", group " + o.NomadGroup
			}
			s += ")"
		}
		parts = append(parts, s)
	}
	if o.ContainerName != "" {
		parts = append(parts, "docker container "+o.ContainerName)
	}
	var ids []string
	if o.ContainerID != "" {
		ids = append(ids, "id "+shortID(o.ContainerID))
	}
	if o.EndpointID != "" {
		ids = append(ids, "endpoint "+shortID(o.EndpointID))
	}
	if o.IfName != "" {
		ids = append(ids, o.IfName)
	}
	if o.NetNS != "" {
		ids = append(ids, "netns "+o.NetNS)
	}
	if o.MAC != "" && o.EndpointID == "" {
		ids = append(ids, "mac "+o.MAC)
	}
	s := strings.Join(parts, ", ")
	if s == "" {
		s = strings.TrimSpace(o.Runtime + " container")
	}
	if len(ids) > 0 {
		s += " [" + strings.Join(ids, ", ") + "]"
	}
	return s
}

// shortID is a container id as runtimes print it (12 characters).
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
