// Command dashboard-schema checks Grafana dashboard JSON files against Grafana's own dashboard
// schema, as the Grafana foundation SDK carries it (github.com/grafana/grafana-foundation-sdk/go,
// generated from Grafana's published schemas): every field must be one the schema knows (strict
// decoding), the result must pass the schema's constraints, and every panel's type must be a
// panel plugin the schema has (deprecated Angular panels such as graph, singlestat and
// table-old have none), whose options and custom field config then decode strictly too.
//
//	dashboard-schema FILE...     # exit 0 when all pass; otherwise one line per problem, exit 1
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboard-schema FILE...")
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins()
	failed := false
	for _, path := range os.Args[1:] {
		for _, problem := range check(path) {
			fmt.Printf("%s: %s\n", path, problem)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

// check returns the problems of the dashboard in path, none when it passes.
func check(path string) []string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return []string{err.Error()}
	}
	var board dashboard.Dashboard
	problems := messages(board.UnmarshalJSONStrict(raw))
	if len(problems) == 0 {
		problems = messages(board.Validate())
	}
	// The panels' types are read from the JSON itself: the SDK's decoder leaves a panel out of
	// board.Panels when its own strict decoding passes (it returns an empty error list as a
	// non-nil error).
	var layout struct{ Panels []panelType }
	if err := json.Unmarshal(raw, &layout); err != nil {
		return append(problems, err.Error())
	}
	for _, panel := range layout.Panels {
		if panel.Type == "row" {
			for _, inner := range panel.Panels {
				problems = append(problems, inner.problems()...)
			}
			continue
		}
		problems = append(problems, panel.problems()...)
	}
	return problems
}

// messages splits the SDK's error into one message per problem. Its strict decoder and
// validator return a cog.BuildErrors, which is a non-nil error even when it holds none.
func messages(err error) []string {
	var build cog.BuildErrors
	if !errors.As(err, &build) {
		if err != nil {
			return []string{err.Error()}
		}
		return nil
	}
	var out []string
	for _, problem := range build {
		out = append(out, "rejected by Grafana's schema: "+problem.Error())
	}
	return out
}

// panelType is what a panel's JSON says of its kind (a row's panels are its collapsed ones).
type panelType struct {
	Type   string      `json:"type"`
	Title  string      `json:"title"`
	Panels []panelType `json:"panels"`
}

// problems names the panel's type when the schema has no panel plugin of that type.
func (panel panelType) problems() []string {
	if _, known := cog.ConfigForPanelcfgVariant(panel.Type); known {
		return nil
	}
	return []string{fmt.Sprintf("panel %q: type %q is unknown to Grafana's schema (or deprecated, as graph, singlestat and table-old are)", panel.Title, panel.Type)}
}
