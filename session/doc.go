// Package session is part of oncewal. See the repository README.
package session
