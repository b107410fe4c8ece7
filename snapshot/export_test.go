package snapshot

// SetInstallStep sets the hook called after each durable step of an install
// or recovery (nil: none).
func SetInstallStep(f func(step string)) { installStep = f }

// HashDir exposes hashDir to the tests: a directory's files and sums.
var HashDir = hashDir
