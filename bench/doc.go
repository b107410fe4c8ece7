// Package bench is part of oncewal. See the repository README.
package bench
