// mc_queue console: keep the page current without a reload.
// Every few seconds, fetch this page's URL with ?partial=1 and swap each region marked data-live
// whose id matches, unless someone is typing in it. Nothing else: no framework, no network but this server.
(function () {
  "use strict";
  var body = document.body;
  var every = parseInt(body.getAttribute("data-poll-ms") || "5000", 10);
  var status = document.getElementById("live-status");
  var busy = false;
  // A page that answers a form (a refused action) is shown at the form's address: put the page's own
  // address back, so that polling and a reload ask for the page, not for the action again.
  var pageUrl = body.getAttribute("data-page-url") || (window.location.pathname + window.location.search);
  if (pageUrl !== window.location.pathname + window.location.search && window.history.replaceState) {
    window.history.replaceState(null, "", pageUrl);
  }

  function editing(region) {
    var active = document.activeElement;
    if (active && region.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) return true;
    return region.querySelector("[data-dirty]") !== null;
  }

  document.addEventListener("input", function (ev) {
    if (ev.target && ev.target.setAttribute) ev.target.setAttribute("data-dirty", "1");
  });

  function say(text, stale) {
    if (!status) return;
    status.textContent = text;
    status.className = stale ? "stale" : "";
  }

  function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    var url = new URL(pageUrl, window.location.href);
    url.searchParams.set("partial", "1");
    fetch(url.toString(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (resp) {
        return resp.text().then(function (html) { return { ok: resp.ok, code: resp.status, html: html }; });
      })
      .then(function (r) {
        var doc = new DOMParser().parseFromString(r.html, "text/html");
        var fresh = doc.querySelectorAll("[data-live][id]");
        var swapped = 0;
        if (r.ok) {
          // Another layout than the one shown (the page was loaded while Redis was down): load it whole.
          for (var k = 0; k < fresh.length; k++) {
            if (!document.getElementById(fresh[k].id)) { window.location.replace(pageUrl); return; }
          }
        }
        for (var i = 0; i < fresh.length; i++) {
          var old = document.getElementById(fresh[i].id);
          if (!old || editing(old)) continue;
          var open = {};
          old.querySelectorAll("details").forEach(function (d, n) { if (d.open) open[n] = true; });
          old.innerHTML = fresh[i].innerHTML;
          old.querySelectorAll("details").forEach(function (d, n) { if (open[n]) d.open = true; });
          swapped++;
        }
        var when = new Date().toLocaleTimeString();
        if (r.code === 503) say("Redis unreachable at " + when + ": retrying", true);
        else if (!r.ok) say("refresh failed (HTTP " + r.code + ") at " + when, true);
        else say("live: updated " + when, false);
        body.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () { say("the console cannot be reached: retrying", true); })
      .then(function () { busy = false; });
  }

  if (every > 0) window.setInterval(refresh, every);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) refresh(); });
})();
