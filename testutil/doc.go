// Package testutil is part of oncewal. See the repository README.
package testutil
