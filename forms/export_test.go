package forms

import "time"

// SetFullScanEvery sets how often claims scan from the first row, until
// the test ends.
func SetFullScanEvery(d time.Duration) { fullScanEvery = d }
