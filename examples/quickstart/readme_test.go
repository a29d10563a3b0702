package main

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeQuickStart: README.md's quick start is this program, word for
// word, so the code a reader copies is the code the tests run.
func TestReadmeQuickStart(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	main, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "## Quick start")
	if !ok {
		t.Fatal(`README.md has no "## Quick start" section`)
	}
	_, code, ok := strings.Cut(after, "```go\n")
	if !ok {
		t.Fatal("README.md's quick start has no ```go block")
	}
	code, _, ok = strings.Cut(code, "```\n")
	if !ok {
		t.Fatal("README.md's quick start block is not closed")
	}
	if code != string(main) {
		t.Errorf("README.md's quick start differs from examples/quickstart/main.go: copy the file into the README (%d bytes there, %d in main.go)", len(code), len(main))
	}
}
