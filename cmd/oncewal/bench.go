package main

import (
	"fmt"
	"io"
)

func runBench(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stdout, "bench: not yet")
	return 0
}
