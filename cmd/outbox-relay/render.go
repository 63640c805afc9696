package main

import (
	"encoding/json"
	"io"
)

// printJSON is the one writer of the commands' --json output: v as one
// indented JSON document and a newline.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// render prints v for scripts (asJSON: printJSON) or for people (text).
func render(w io.Writer, asJSON bool, v any, text func(io.Writer) error) error {
	if asJSON {
		return printJSON(w, v)
	}
	return text(w)
}
