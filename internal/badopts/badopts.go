// Package badopts words the error every options type's Validate returns:
// its package's ErrBadOptions, the type, and every problem joined (the
// options convention in README.md, "Conventions").
package badopts

import (
	"errors"
	"fmt"
)

// Wrap returns nil without problems, else "<sentinel>: <typ>: <problems>",
// wrapping sentinel and every problem.
func Wrap(sentinel error, typ string, problems []error) error {
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: %w", sentinel, typ, errors.Join(problems...))
}
