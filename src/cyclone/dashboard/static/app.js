// Cyclone dashboard: local times, live refresh, confirmation. No inline script: the
// Content-Security-Policy allows only this file.
(function () {
  "use strict";

  function localTimes(scope) {
    scope.querySelectorAll("time[datetime]").forEach(function (el) {
      var at = new Date(el.getAttribute("datetime"));
      if (isNaN(at)) { return; }
      el.title = el.getAttribute("datetime");
      el.textContent = at.getFullYear() + "-" + pad(at.getMonth() + 1) + "-" + pad(at.getDate()) +
        " " + pad(at.getHours()) + ":" + pad(at.getMinutes()) + ":" + pad(at.getSeconds());
    });
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }

  // Replace <main> with the same page fetched again (server-rendered, escaped HTML).
  function reloadMain() {
    return fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main) {
          // a message of the last action stays until the next navigation
          var flash = main.querySelector(".flash");
          if (flash && !fresh.querySelector(".flash")) { fresh.insertBefore(doc.importNode(flash, true), fresh.firstChild); }
          var scroll = document.querySelector(".dag-wrap");
          var left = scroll ? scroll.scrollLeft : 0, top = scroll ? scroll.scrollTop : 0;
          main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes).map(function (n) { return document.importNode(n, true); }));
          var again = document.querySelector(".dag-wrap");
          if (again) { again.scrollLeft = left; again.scrollTop = top; }
          start();
        }
      });
  }

  var timer = null;
  function schedule(fn, ms) { clearTimeout(timer); timer = setTimeout(fn, ms); }

  // Whether states read now differ from those the page was rendered with.
  function differsFromPage(s) {
    var shown = document.querySelector("[data-run-state]");
    if (shown && shown.getAttribute("data-run-state") !== s.run_state) { return true; }
    var nodes = document.querySelectorAll("svg.dag [data-node]");
    for (var i = 0; i < nodes.length; i++) {
      var node = nodes[i].getAttribute("data-node");
      if (s.nodes[node] !== undefined && s.nodes[node] !== nodes[i].getAttribute("data-state")) { return true; }
    }
    return false;
  }

  // A running run's page: poll its states; when any changed, render the page again.
  function watchRun(url) {
    var last = null;
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (s) {
          if (!s) { schedule(tick, 4000); return; }
          var now = JSON.stringify(s);
          var changed = last === null ? differsFromPage(s) : now !== last;
          last = now;
          if (changed) { reloadMain(); return; }
          schedule(tick, 1000);
        })
        .catch(function () { schedule(tick, 4000); });
    }
    tick();
  }

  function start() {
    localTimes(document);
    var live = document.querySelector("[data-live]");
    if (live) { watchRun(live.getAttribute("data-live")); return; }
    var every = document.querySelector("[data-refresh]");
    if (every) {
      schedule(function () { reloadMain().catch(function () { start(); }); }, parseInt(every.getAttribute("data-refresh"), 10) || 5000);
    }
  }

  document.addEventListener("DOMContentLoaded", start);
})();
