package main

import (
	"fmt"
	"io"
)

func runDemo(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stdout, "demo: not yet")
	return 0
}
