package dcosproto

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// The .proto file is the descriptor's text form, and both follow the table
// of docs/dcos-overlay.md field by field (name, number, type, label).
func TestProtoFileAgreesWithDescriptorAndDoc(t *testing.T) {
	want, err := os.ReadFile("testdata/overlay.proto")
	if err != nil {
		t.Fatal(err)
	}
	if got := ProtoText(FileProto()); got != string(want) {
		t.Fatalf("testdata/overlay.proto and the descriptor differ; the descriptor reads:\n%s", got)
	}
	fd, err := File()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../../docs/dcos-overlay.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 7 || strings.TrimSpace(cells[3]) == "no." || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		msgName, fieldName := strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2])
		num, err := strconv.Atoi(strings.TrimSpace(cells[3]))
		if err != nil {
			continue
		}
		typ, label := strings.TrimSpace(cells[4]), strings.TrimSpace(cells[5])
		rows++
		var md protoreflect.MessageDescriptor
		for i, part := range strings.Split(msgName, ".") {
			if i == 0 {
				md = fd.Messages().ByName(protoreflect.Name(part))
			} else if md != nil {
				md = md.Messages().ByName(protoreflect.Name(part))
			}
		}
		if md == nil {
			t.Errorf("doc names message %s, the schema has none", msgName)
			continue
		}
		f := md.Fields().ByName(protoreflect.Name(fieldName))
		if f == nil {
			t.Errorf("doc names %s.%s, the schema has none", msgName, fieldName)
			continue
		}
		gotType := f.Kind().String()
		switch f.Kind() {
		case protoreflect.MessageKind:
			gotType = string(f.Message().FullName().Name())
			if f.Message().Parent() != fd {
				gotType = strings.TrimPrefix(string(f.Message().FullName()), Package+".")
			}
		case protoreflect.EnumKind:
			gotType = "enum " + string(f.Enum().Name())
		}
		if int(f.Number()) != num || gotType != typ || f.Cardinality().String() != label {
			t.Errorf("%s.%s: schema %d %s %s, doc %d %s %s", msgName, fieldName, f.Number(), gotType, f.Cardinality(), num, typ, label)
		}
	}
	if rows != 35 {
		t.Errorf("read %d field rows from the doc's table, want 35", rows)
	}
}

const goodAgent = `{"ip":"198.18.0.1","agent_id":"extension","configuration_attempts":1,"overlays":[
 {"info":{"name":"dcos","subnet":"9.0.0.0/8","prefix":24,"enabled":true},"subnet":"9.0.0.0/24",
  "mesos_bridge":{"name":"m-dcos","ip":"9.0.0.0/25"},
  "backend":{"vxlan":{"vni":1024,"vtep_name":"vtep1024","vtep_ip":"44.128.0.1/20","vtep_mac":"70:b3:d5:80:00:01","vtep_port":64000}},
  "state":{"status":"STATUS_OK"}}]}`

// A DC/OS consumer refuses what carve wrote before: no ip, a failed
// overlay without backend, a status outside the enum, enabled left out.
func TestDecodeRefusesWhatDCOSRefuses(t *testing.T) {
	if a, err := Decode("AgentInfo", []byte(goodAgent)); err != nil {
		t.Fatalf("a valid record: %v", err)
	} else if err := CheckAgent(a); err != nil {
		t.Fatalf("a valid record: %v", err)
	}
	tests := []struct{ name, from, to string }{
		{"no ip", `"ip":"198.18.0.1",`, ``},
		{"no backend", `"backend":{"vxlan":{"vni":1024,"vtep_name":"vtep1024","vtep_ip":"44.128.0.1/20","vtep_mac":"70:b3:d5:80:00:01","vtep_port":64000}},`, ``},
		{"STATUS_DISABLED", `STATUS_OK`, `STATUS_DISABLED`},
		{"enabled not written", `"enabled":true`, `"x":1`},
		{"no configuration_attempts", `"configuration_attempts":1,`, ``},
		{"upper-case MAC", `70:b3:d5`, `70:B3:D5`},
		{"no vtep_mac", `,"vtep_mac":"70:b3:d5:80:00:01"`, ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad := strings.Replace(goodAgent, tt.from, tt.to, 1)
			if bad == goodAgent {
				t.Fatal("the mutation changed nothing")
			}
			a, err := Decode("AgentInfo", []byte(bad))
			if err == nil {
				err = CheckAgent(a)
			}
			if err == nil {
				t.Errorf("accepted:\n%s", bad)
			}
		})
	}
}
