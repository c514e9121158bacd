// Live refresh of the pages that ask for it (`<main data-live="5000">`): the page is fetched
// again and its content replaced, unless the operator is typing in it or it is hidden. The
// pages read the same without this script.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  if (!main || !window.fetch || !window.DOMParser) {
    return;
  }
  var every = parseInt(main.getAttribute("data-live"), 10) || 5000;
  function busy() {
    var active = document.activeElement;
    return document.hidden || (active && main.contains(active) &&
      /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName));
  }
  function refresh() {
    if (busy()) {
      return;
    }
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Outbox-Live": "1" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (!text || busy()) {
          return;
        }
        var fresh = new DOMParser().parseFromString(text, "text/html").querySelector("main");
        if (fresh) {
          main.innerHTML = fresh.innerHTML;
          main.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () { /* the next tick tries again */ });
  }
  window.setInterval(refresh, every);
})();
