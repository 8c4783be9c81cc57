// Package dcosproto is a protobuf schema of DC/OS's overlay messages
// (package mesos.modules.overlay, proto2), written from the facts in
// docs/dcos-overlay.md, for tests: it decodes the masters' state and the
// agent records the way a DC/OS consumer does (protojson, unknown keys
// ignored), and checks what DC/OS consumers read. carve's extensions are
// extra keys, which such a consumer ignores; a missing required field, or
// a status outside DC/OS's enum, fails here as it would there.
//
// The schema is built as a descriptor (google.golang.org/protobuf's
// descriptorpb and protodesc), and testdata/overlay.proto is its text form
// (ProtoText), checked to agree in this package's tests.
package dcosproto

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Package is the protobuf package of DC/OS's overlay messages.
const Package = "mesos.modules.overlay"

// StatusValues are DC/OS's enum Status, by number: there is no other value.
var StatusValues = []string{"STATUS_INVALID", "STATUS_OK", "STATUS_FAILED", "STATUS_CONFIGURING"}

type field struct {
	name     string
	number   int32
	label    descriptorpb.FieldDescriptorProto_Label
	typ      descriptorpb.FieldDescriptorProto_Type
	typeName string // message or enum, relative to the package
	def      string
}

const (
	required = descriptorpb.FieldDescriptorProto_LABEL_REQUIRED
	optional = descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL
	repeated = descriptorpb.FieldDescriptorProto_LABEL_REPEATED
	tString  = descriptorpb.FieldDescriptorProto_TYPE_STRING
	tUint32  = descriptorpb.FieldDescriptorProto_TYPE_UINT32
	tBool    = descriptorpb.FieldDescriptorProto_TYPE_BOOL
	tMessage = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
	tEnum    = descriptorpb.FieldDescriptorProto_TYPE_ENUM
)

func message(name string, fields []field, nested ...*descriptorpb.DescriptorProto) *descriptorpb.DescriptorProto {
	m := &descriptorpb.DescriptorProto{Name: proto.String(name), NestedType: nested}
	for _, f := range fields {
		fd := &descriptorpb.FieldDescriptorProto{
			Name: proto.String(f.name), Number: proto.Int32(f.number), Label: f.label.Enum(), Type: f.typ.Enum(),
		}
		if f.typeName != "" {
			fd.TypeName = proto.String("." + Package + "." + f.typeName)
		}
		if f.def != "" {
			fd.DefaultValue = proto.String(f.def)
		}
		m.Field = append(m.Field, fd)
	}
	return m
}

// FileProto is the schema as a FileDescriptorProto (overlay.proto).
func FileProto() *descriptorpb.FileDescriptorProto {
	status := &descriptorpb.EnumDescriptorProto{Name: proto.String("Status")}
	for i, v := range StatusValues {
		status.Value = append(status.Value, &descriptorpb.EnumValueDescriptorProto{Name: proto.String(v), Number: proto.Int32(int32(i))})
	}
	state := message("State", []field{
		{"status", 1, optional, tEnum, "AgentOverlayInfo.Status", "STATUS_INVALID"},
		{"error", 2, optional, tString, "", ""},
	})
	agentOverlay := message("AgentOverlayInfo", []field{
		{"info", 1, required, tMessage, "OverlayInfo", ""},
		{"subnet", 2, optional, tString, "", ""},
		{"mesos_bridge", 3, optional, tMessage, "BridgeInfo", ""},
		{"docker_bridge", 4, optional, tMessage, "BridgeInfo", ""},
		{"backend", 5, required, tMessage, "BackendInfo", ""},
		{"state", 6, optional, tMessage, "AgentOverlayInfo.State", ""},
		{"subnet6", 7, optional, tString, "", ""},
	}, state)
	agentOverlay.EnumType = []*descriptorpb.EnumDescriptorProto{status}
	return &descriptorpb.FileDescriptorProto{
		Name:    proto.String("overlay.proto"),
		Package: proto.String(Package),
		Syntax:  proto.String("proto2"),
		MessageType: []*descriptorpb.DescriptorProto{
			message("BridgeInfo", []field{
				{"name", 1, required, tString, "", ""},
				{"ip", 2, optional, tString, "", ""},
				{"ip6", 3, optional, tString, "", ""},
			}),
			message("VxLANInfo", []field{
				{"vni", 1, required, tUint32, "", ""},
				{"vtep_name", 2, required, tString, "", ""},
				{"vtep_ip", 3, required, tString, "", ""},
				{"vtep_mac", 4, required, tString, "", ""},
				{"vtep_ip6", 5, optional, tString, "", ""},
				{"vtep_mtu", 6, optional, tUint32, "", ""},
			}),
			message("BackendInfo", []field{
				{"vxlan", 1, optional, tMessage, "VxLANInfo", ""},
			}),
			message("OverlayInfo", []field{
				{"name", 1, required, tString, "", ""},
				{"subnet", 2, optional, tString, "", ""},
				{"prefix", 3, optional, tUint32, "", ""},
				{"subnet6", 4, optional, tString, "", ""},
				{"prefix6", 5, optional, tUint32, "", ""},
				{"enabled", 6, optional, tBool, "", "true"},
			}),
			agentOverlay,
			message("AgentInfo", []field{
				{"ip", 1, required, tString, "", ""},
				{"overlays", 2, repeated, tMessage, "AgentOverlayInfo", ""},
				{"configuration_attempts", 3, optional, tUint32, "", ""},
			}),
			message("State", []field{
				{"network", 1, optional, tMessage, "NetworkConfig", ""},
				{"agents", 2, repeated, tMessage, "AgentInfo", ""},
			}),
			message("NetworkConfig", []field{
				{"vtep_subnet", 1, required, tString, "", ""},
				{"vtep_mac_oui", 2, required, tString, "", ""},
				{"overlays", 3, repeated, tMessage, "OverlayInfo", ""},
				{"vtep_subnet6", 4, optional, tString, "", ""},
				{"vtep_mtu", 5, optional, tUint32, "", ""},
			}),
		},
	}
}

// File is the schema as a protobuf file descriptor.
func File() (protoreflect.FileDescriptor, error) {
	fd, err := protodesc.NewFile(FileProto(), nil)
	if err != nil {
		return nil, fmt.Errorf("build the overlay.proto descriptor: %w", err)
	}
	return fd, nil
}

// Decode decodes JSON into a new message of the schema's type name (State,
// AgentInfo, ...) as a DC/OS consumer does: unknown keys ignored, required
// fields checked.
func Decode(name string, data []byte) (*dynamicpb.Message, error) {
	fd, err := File()
	if err != nil {
		return nil, err
	}
	md := fd.Messages().ByName(protoreflect.Name(name))
	if md == nil {
		return nil, fmt.Errorf("no message %s in overlay.proto", name)
	}
	msg := dynamicpb.NewMessage(md)
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, msg); err != nil {
		return nil, fmt.Errorf("decode %s: %w", name, err)
	}
	if err := proto.CheckInitialized(msg); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return msg, nil
}

// ProtoText is the schema in .proto syntax, in the form of
// testdata/overlay.proto.
func ProtoText(f *descriptorpb.FileDescriptorProto) string {
	var b strings.Builder
	fmt.Fprintf(&b, "// DC/OS's overlay messages, written from docs/dcos-overlay.md.\n")
	fmt.Fprintf(&b, "syntax = %q;\n\npackage %s;\n", f.GetSyntax(), f.GetPackage())
	for _, m := range f.MessageType {
		b.WriteString("\n")
		writeMessage(&b, m, "")
	}
	return b.String()
}

func writeMessage(b *strings.Builder, m *descriptorpb.DescriptorProto, indent string) {
	fmt.Fprintf(b, "%smessage %s {\n", indent, m.GetName())
	in := indent + "  "
	for _, e := range m.EnumType {
		fmt.Fprintf(b, "%senum %s {\n", in, e.GetName())
		for _, v := range e.Value {
			fmt.Fprintf(b, "%s  %s = %d;\n", in, v.GetName(), v.GetNumber())
		}
		fmt.Fprintf(b, "%s}\n", in)
	}
	for _, n := range m.NestedType {
		writeMessage(b, n, in)
	}
	for _, f := range m.Field {
		label := strings.ToLower(strings.TrimPrefix(f.GetLabel().String(), "LABEL_"))
		typ := strings.ToLower(strings.TrimPrefix(f.GetType().String(), "TYPE_"))
		if f.TypeName != nil {
			typ = strings.TrimPrefix(f.GetTypeName(), "."+Package+".")
		}
		def := ""
		if f.DefaultValue != nil {
			def = fmt.Sprintf(" [default = %s]", f.GetDefaultValue())
		}
		fmt.Fprintf(b, "%s%s %s %s = %d%s;\n", in, label, typ, f.GetName(), f.GetNumber(), def)
	}
	fmt.Fprintf(b, "%s}\n", indent)
}

// CheckState checks, in a decoded State, every field DC/OS consumers read:
// the network configuration (required fields, every overlay's name and
// enabled written) and every agent (CheckAgent).
func CheckState(st protoreflect.Message) error {
	f := fields(st)
	if !st.Has(f("network")) {
		return fmt.Errorf("state: no network")
	}
	nw := st.Get(f("network")).Message()
	nf := fields(nw)
	if _, err := netip.ParsePrefix(nw.Get(nf("vtep_subnet")).String()); err != nil {
		return fmt.Errorf("network.vtep_subnet: %w", err)
	}
	ovs := nw.Get(nf("overlays")).List()
	for i := range ovs.Len() {
		if err := checkOverlayInfo(ovs.Get(i).Message()); err != nil {
			return fmt.Errorf("network.overlays[%d]: %w", i, err)
		}
	}
	agents := st.Get(f("agents")).List()
	for i := range agents.Len() {
		if err := CheckAgent(agents.Get(i).Message()); err != nil {
			return fmt.Errorf("agents[%d]: %w", i, err)
		}
	}
	return nil
}

// CheckAgent checks a decoded AgentInfo: an IPv4 ip; configuration_attempts
// written; per overlay its info, subnets, bridges, VXLAN backend and a state
// whose status is one of DC/OS's (an error with STATUS_FAILED).
func CheckAgent(a protoreflect.Message) error {
	f := fields(a)
	if ip, err := netip.ParseAddr(a.Get(f("ip")).String()); err != nil || !ip.Is4() {
		return fmt.Errorf("ip %q is not an IPv4 address", a.Get(f("ip")).String())
	}
	if !a.Has(f("configuration_attempts")) {
		return fmt.Errorf("ip %s: configuration_attempts not written", a.Get(f("ip")).String())
	}
	ovs := a.Get(f("overlays")).List()
	for i := range ovs.Len() {
		if err := checkAgentOverlay(ovs.Get(i).Message()); err != nil {
			return fmt.Errorf("ip %s: overlays[%d]: %w", a.Get(f("ip")).String(), i, err)
		}
	}
	return nil
}

func checkOverlayInfo(o protoreflect.Message) error {
	f := fields(o)
	if o.Get(f("name")).String() == "" {
		return fmt.Errorf("empty name")
	}
	if !o.Has(f("enabled")) {
		return fmt.Errorf("overlay %s: enabled not written (DC/OS always writes it)", o.Get(f("name")).String())
	}
	if !o.Has(f("subnet")) && !o.Has(f("subnet6")) {
		return fmt.Errorf("overlay %s: neither subnet nor subnet6", o.Get(f("name")).String())
	}
	if o.Has(f("subnet")) {
		p, err := netip.ParsePrefix(o.Get(f("subnet")).String())
		if err != nil || !p.Addr().Is4() || o.Get(f("prefix")).Uint() <= uint64(p.Bits()) {
			return fmt.Errorf("overlay %s: subnet %q prefix %d", o.Get(f("name")).String(), o.Get(f("subnet")).String(), o.Get(f("prefix")).Uint())
		}
	}
	if o.Has(f("subnet6")) {
		p, err := netip.ParsePrefix(o.Get(f("subnet6")).String())
		if err != nil || !p.Addr().Is6() || o.Get(f("prefix6")).Uint() <= uint64(p.Bits()) {
			return fmt.Errorf("overlay %s: subnet6 %q prefix6 %d", o.Get(f("name")).String(), o.Get(f("subnet6")).String(), o.Get(f("prefix6")).Uint())
		}
	}
	return nil
}

func checkAgentOverlay(o protoreflect.Message) error {
	f := fields(o)
	info := o.Get(f("info")).Message()
	if err := checkOverlayInfo(info); err != nil {
		return err
	}
	name := info.Get(fields(info)("name")).String()
	if !info.Get(fields(info)("enabled")).Bool() {
		return fmt.Errorf("overlay %s: a disabled overlay in an agent's record", name)
	}
	if !o.Has(f("subnet")) && !o.Has(f("subnet6")) {
		return fmt.Errorf("overlay %s: leased without subnet or subnet6", name)
	}
	for _, k := range []string{"subnet", "subnet6"} {
		if o.Has(f(k)) {
			if _, err := netip.ParsePrefix(o.Get(f(k)).String()); err != nil {
				return fmt.Errorf("overlay %s: %s: %w", name, k, err)
			}
		}
	}
	for _, k := range []string{"mesos_bridge", "docker_bridge"} {
		if !o.Has(f(k)) {
			continue
		}
		br := o.Get(f(k)).Message()
		bf := fields(br)
		if br.Get(bf("name")).String() == "" || (!br.Has(bf("ip")) && !br.Has(bf("ip6"))) {
			return fmt.Errorf("overlay %s: %s without name or address", name, k)
		}
		for _, a := range []string{"ip", "ip6"} {
			if br.Has(bf(a)) {
				if _, err := netip.ParsePrefix(br.Get(bf(a)).String()); err != nil {
					return fmt.Errorf("overlay %s: %s.%s: %w", name, k, a, err)
				}
			}
		}
	}
	backend := o.Get(f("backend")).Message()
	if !backend.Has(fields(backend)("vxlan")) {
		return fmt.Errorf("overlay %s: backend without vxlan", name)
	}
	vx := backend.Get(fields(backend)("vxlan")).Message()
	vf := fields(vx)
	if vx.Get(vf("vni")).Uint() == 0 || vx.Get(vf("vtep_name")).String() == "" {
		return fmt.Errorf("overlay %s: vxlan vni %d name %q", name, vx.Get(vf("vni")).Uint(), vx.Get(vf("vtep_name")).String())
	}
	if p, err := netip.ParsePrefix(vx.Get(vf("vtep_ip")).String()); err != nil || !p.Addr().Is4() {
		return fmt.Errorf("overlay %s: vtep_ip %q", name, vx.Get(vf("vtep_ip")).String())
	}
	mac := vx.Get(vf("vtep_mac")).String()
	if hw, err := net.ParseMAC(mac); err != nil || hw.String() != mac {
		return fmt.Errorf("overlay %s: vtep_mac %q is not a lower-case colon-form MAC", name, mac)
	}
	if vx.Has(vf("vtep_ip6")) {
		if p, err := netip.ParsePrefix(vx.Get(vf("vtep_ip6")).String()); err != nil || !p.Addr().Is6() {
			return fmt.Errorf("overlay %s: vtep_ip6 %q", name, vx.Get(vf("vtep_ip6")).String())
		}
	}
	if !o.Has(f("state")) {
		return fmt.Errorf("overlay %s: no state", name)
	}
	st := o.Get(f("state")).Message()
	sf := fields(st)
	if !st.Has(sf("status")) {
		return fmt.Errorf("overlay %s: state.status missing or outside DC/OS's enum", name)
	}
	status := StatusValues[st.Get(sf("status")).Enum()]
	if status == "STATUS_INVALID" {
		return fmt.Errorf("overlay %s: state.status %s", name, status)
	}
	if status == "STATUS_FAILED" && st.Get(sf("error")).String() == "" {
		return fmt.Errorf("overlay %s: STATUS_FAILED without error", name)
	}
	return nil
}

// Status is the state.status of a decoded AgentInfo's overlay, by name ("" when absent).
func Status(a protoreflect.Message, overlay string) (status, errMsg string) {
	ovs := a.Get(fields(a)("overlays")).List()
	for i := range ovs.Len() {
		o := ovs.Get(i).Message()
		f := fields(o)
		info := o.Get(f("info")).Message()
		if info.Get(fields(info)("name")).String() != overlay {
			continue
		}
		st := o.Get(f("state")).Message()
		sf := fields(st)
		if !st.Has(sf("status")) {
			return "", ""
		}
		return StatusValues[st.Get(sf("status")).Enum()], st.Get(sf("error")).String()
	}
	return "", ""
}

// fields looks up a message's fields by name; an unknown name is a bug in
// this package (the schema is fixed), hence the panic.
func fields(m protoreflect.Message) func(string) protoreflect.FieldDescriptor {
	return func(name string) protoreflect.FieldDescriptor {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			panic(fmt.Sprintf("dcosproto: %s has no field %s", m.Descriptor().FullName(), name))
		}
		return fd
	}
}
