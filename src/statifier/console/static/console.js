// The statifier console's only script: on a "changed" server-sent event, fetch the
// page again and replace its live fragments ([data-live] elements, matched by id).
// A page with a [data-poll] element (a shadow replay or a bulk run going) is fetched again every
// data-poll milliseconds instead, until the fresh page has none.
// Every page reads the same without it.
(function () {
  "use strict";
  var source = null;
  var pending = false;
  var timer = null;
  var status = document.getElementById("live-status");

  function refresh() {
    if (pending) { return; }
    pending = true;
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (text === null) { return; }
        var fresh = new DOMParser().parseFromString(text, "text/html");
        document.querySelectorAll("[data-live][id]").forEach(function (old) {
          var next = fresh.getElementById(old.id);
          if (next) { old.replaceWith(document.importNode(next, true)); }
        });
        document.body.dataset.refreshed = String(Date.now());
      })
      .catch(function () { /* the next event tries again */ })
      .then(function () { pending = false; poll(); });
  }

  function poll() {
    var polled = document.querySelector("[data-poll]");
    if (!polled || timer !== null) { return; }  // one timer, however it was asked for
    var every = Math.max(250, parseInt(polled.getAttribute("data-poll"), 10) || 1000);
    timer = window.setTimeout(function () { timer = null; refresh(); }, every);
  }

  function listen() {
    if (!window.EventSource || !document.body.dataset.events) { return; }
    source = new EventSource(document.body.dataset.events);
    source.addEventListener("open", function () { if (status) { status.hidden = false; } });
    source.addEventListener("error", function () { if (status) { status.hidden = true; } });
    source.addEventListener("changed", refresh);
  }

  listen();
  poll();
})();
