// Command oncewal runs the oncewal demo and tools.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "demo" {
		fmt.Fprintln(os.Stderr, "usage: oncewal demo")
		os.Exit(2)
	}
	fmt.Println("oncewal demo: not yet implemented")
}
