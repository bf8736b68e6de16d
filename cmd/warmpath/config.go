package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/warmpath/warmpath/gateway"
)

// runConfig validates a configuration offline: `warmpath config check
// [--env=false] FILE`. It prints every problem on its own line, naming the
// field, and fails when there is one; it binds nothing and dials nothing.
func runConfig(_ context.Context, args []string) error {
	return configCommand(args, os.Getenv, os.Stdout, os.Stderr)
}

func configCommand(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		return errors.New("usage: warmpath config check [--env=false] FILE")
	}
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	env := fs.Bool("env", true, "apply WARMPATH_* environment overrides, as serve does")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("want one configuration file, got %d arguments; usage: warmpath config check [--env=false] FILE", fs.NArg())
	}
	path := fs.Arg(0)
	if !*env {
		getenv = nil
	}
	cfg, err := gateway.LoadConfig(path, getenv)
	if err == nil {
		err = cfg.Check()
	}
	if err != nil {
		problems := configProblems(err)
		for _, p := range problems {
			fmt.Fprintln(stderr, p)
		}
		return fmt.Errorf("%s: %d problem(s)", path, len(problems))
	}
	fleet := fmt.Sprintf("%d replicas, %d discovery names", len(cfg.Replicas), len(cfg.Discovery))
	if cfg.Embedded() {
		fleet = "no fleet: serve starts the embedded simulated fleet"
	}
	fmt.Fprintf(stdout, "%s: ok (%s)\n", path, fleet)
	return nil
}

// configProblems flattens joined errors into one line each; YAML decoding
// reports several unknown or mistyped fields in one multi-line error.
func configProblems(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		lines := strings.Split(strings.TrimSpace(e.Error()), "\n")
		if len(lines) > 1 && strings.HasSuffix(lines[0], ":") {
			lines = lines[1:] // "yaml: unmarshal errors:" heads its list
		}
		for _, l := range lines {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	walk(err)
	return out
}
