// Package follower is part of oncewal. See the repository README.
package follower
