// Package tshark decodes captures with Wireshark's dissectors, the
// independent judge of what softrnic puts on the wire.
package tshark

import (
	"encoding/xml"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// IWARPArgs turn on Wireshark's iWARP dissectors. MPA is found only by its
// TCP heuristic, which needs the MPA Request and Reply in the capture; the
// two heuristics that would claim Send payloads are turned off.
var IWARPArgs = []string{
	"--enable-heuristic", "iwarp_mpa_tcp",
	"-o", "tcp.try_heuristic_first:TRUE",
	"--disable-heuristic", "rpcrdma_iwarp",
	"--disable-heuristic", "smb_direct_iwarp",
}

// Field is one dissected field.
type Field struct {
	Name     string
	Show     string // the value as Wireshark shows it
	ShowName string // the whole display line
	Value    string // the raw octets in hex, where Wireshark gives them
}

// Uint parses Show as an unsigned number: decimal, 0x-prefixed, or octets
// in hex separated by colons (how Wireshark shows FT_BYTES fields).
func (f Field) Uint() (uint64, error) {
	if strings.Contains(f.Show, ":") {
		return strconv.ParseUint(strings.ReplaceAll(f.Show, ":", ""), 16, 64)
	}
	return strconv.ParseUint(f.Show, 0, 64)
}

// Proto is one protocol layer of a packet with its fields, nested fields
// flattened in document order.
type Proto struct {
	Name   string
	Fields []Field
}

// Get returns the first field with the name.
func (p *Proto) Get(name string) (Field, bool) {
	for _, f := range p.Fields {
		if f.Name == name {
			return f, true
		}
	}
	return Field{}, false
}

// Packet is one frame with its layers in order. A frame that completes
// several PDUs holds one layer per PDU, in stream order.
type Packet struct {
	Number int
	Protos []Proto
}

// Field returns the first field with the name in any layer.
func (p *Packet) Field(name string) (Field, bool) {
	for i := range p.Protos {
		if f, ok := p.Protos[i].Get(name); ok {
			return f, true
		}
	}
	return Field{}, false
}

type pdml struct {
	Packets []struct {
		Protos []xmlProto `xml:"proto"`
	} `xml:"packet"`
}

type xmlProto struct {
	Name   string     `xml:"name,attr"`
	Fields []xmlField `xml:"field"`
	Protos []xmlProto `xml:"proto"`
}

type xmlField struct {
	Name     string     `xml:"name,attr"`
	Show     string     `xml:"show,attr"`
	ShowName string     `xml:"showname,attr"`
	Value    string     `xml:"value,attr"`
	Fields   []xmlField `xml:"field"`
	Protos   []xmlProto `xml:"proto"`
}

// Dissect runs tshark over a capture file with the extra arguments and
// returns its PDML decoded.
func Dissect(path string, args ...string) ([]Packet, error) {
	full := append([]string{"-r", path, "-T", "pdml"}, args...)
	cmd := exec.Command("tshark", full...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("tshark %s: %w: %s", strings.Join(full, " "), err, stderr.String())
	}
	var doc pdml
	if err := xml.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("tshark: decode PDML: %w", err)
	}
	pkts := make([]Packet, len(doc.Packets))
	for i, p := range doc.Packets {
		pkts[i].Number = i + 1
		for _, xp := range p.Protos {
			pkts[i].Protos = flattenProto(pkts[i].Protos, xp)
		}
	}
	return pkts, nil
}

// flattenProto appends the layer and any layers nested in it, in order.
func flattenProto(out []Proto, xp xmlProto) []Proto {
	idx := len(out)
	out = append(out, Proto{Name: xp.Name})
	var nested []xmlProto
	var walk func(fs []xmlField)
	walk = func(fs []xmlField) {
		for _, f := range fs {
			out[idx].Fields = append(out[idx].Fields, Field{Name: f.Name, Show: f.Show, ShowName: f.ShowName, Value: f.Value})
			walk(f.Fields)
			nested = append(nested, f.Protos...)
		}
	}
	walk(xp.Fields)
	nested = append(nested, xp.Protos...)
	for _, np := range nested {
		out = flattenProto(out, np)
	}
	return out
}
