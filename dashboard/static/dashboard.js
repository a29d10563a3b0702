// sqlxbroker dashboard: refreshes the counts in the page from counts.json
// every data-refresh milliseconds, and asks before forms marked
// data-confirm submit. The page works without it (reload for new counts).
(function () {
  "use strict";
  var body = document.body;
  var url = body.getAttribute("data-counts-url");
  var every = parseInt(body.getAttribute("data-refresh"), 10) || 2000;
  var status = document.getElementById("status");

  function setStatus(text, stale) {
    if (!status) return;
    status.textContent = text;
    status.classList.toggle("stale", !!stale);
  }

  // update writes one table's cells wherever the page shows them: overview
  // rows (tr[data-table]) and a table page's tabs (nav[data-table]).
  function update(t) {
    document.querySelectorAll("[data-table]").forEach(function (el) {
      if (el.getAttribute("data-table") !== t.name) return;
      el.querySelectorAll("[data-cell]").forEach(function (c) {
        var key = c.getAttribute("data-cell");
        if (!(key in t.cells)) return;
        var target = c.querySelector("a, span") || c;
        if (c.classList.contains("count")) target = c;
        target.textContent = t.cells[key];
      });
    });
    document.querySelectorAll("[data-error-for]").forEach(function (el) {
      if (el.getAttribute("data-error-for") !== t.name) return;
      var cell = el.querySelector("td") || el;
      cell.textContent = t.error || "";
      el.hidden = !t.error;
    });
  }

  function refresh() {
    fetch(url, { headers: { "Accept": "application/json" }, cache: "no-store" })
      .then(function (r) {
        return r.json().then(function (j) {
          if (!r.ok) throw new Error(j.error || r.statusText);
          return j;
        });
      })
      .then(function (j) {
        (j.tables || []).forEach(update);
        var at = new Date(j.at).toISOString().substring(11, 19) + " UTC";
        var counted = document.getElementById("counted-at");
        if (counted) counted.textContent = at;
        setStatus("counts at " + at, false);
      })
      .catch(function (e) { setStatus("refresh failed: " + e.message, true); })
      .finally(function () { setTimeout(refresh, every); });
  }

  document.querySelectorAll("form[data-confirm]").forEach(function (f) {
    f.addEventListener("submit", function (ev) {
      if (!window.confirm(f.getAttribute("data-confirm"))) ev.preventDefault();
    });
  });

  if (url) setTimeout(refresh, every);
})();
