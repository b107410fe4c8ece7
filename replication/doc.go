// Package replication is part of oncewal. See the repository README.
package replication
