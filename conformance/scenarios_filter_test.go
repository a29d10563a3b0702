package conformance_test

import (
	"strings"
	"testing"

	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/examples/leaseonly"
)

// TestScenariosFilter: Target.Scenarios runs the named scenarios of each
// offered form and still checks the forms not offered; a name the suite
// does not have fails the run, naming it.
func TestScenariosFilter(t *testing.T) {
	tg := exampleTarget(t, leaseonly.Dialect{})
	tg.Scenarios = []string{"Attempts", "Outcomes"}
	got := map[string]string{}
	for _, r := range conformance.RunAll(tg, nil) {
		got[r.Form.String()+"/"+r.Scenario] = r.Status
	}
	want := map[string]string{"lease/Attempts": "pass", "lease/Outcomes": "pass"}
	for _, f := range core.Forms {
		if !core.CapabilitiesOf(leaseonly.Dialect{}).Offers(f) {
			want[f.String()+"/Unavailable"] = "pass"
		}
	}
	if len(got) != len(want) {
		t.Errorf("ran %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q (ran %v)", k, got[k], v, got)
		}
	}

	tg.Scenarios = []string{"Attempts", "NoSuchScenario"}
	rs := conformance.RunAll(tg, nil)
	if len(rs) != 1 || rs[0].Status != "fail" || !strings.Contains(strings.Join(rs[0].Log, " "), `"NoSuchScenario"`) {
		t.Errorf("an unknown scenario name: %+v, want one failed result naming it", rs)
	}
}

// TestRefusedCatchesServedForm: a form listed in Target.Refuses runs the
// Refused scenario alone, which fails on a dialect that serves the form.
func TestRefusedCatchesServedForm(t *testing.T) {
	tg := exampleTarget(t, leaseonly.Dialect{})
	tg.Refuses = []core.Form{core.Lease}
	var lease []conformance.Result
	for _, r := range conformance.RunAll(tg, nil) {
		if r.Form == core.Lease {
			lease = append(lease, r)
		}
	}
	if len(lease) != 1 || lease[0].Scenario != "Refused" || lease[0].Status != "fail" {
		t.Fatalf("lease results %+v, want the Refused scenario alone, failed", lease)
	}
	if log := strings.Join(lease[0].Log, " "); !strings.Contains(log, "succeeded") {
		t.Errorf("the failure %q does not say the subscription succeeded", log)
	}
}
