// Package wal is part of oncewal. See the repository README.
package wal
