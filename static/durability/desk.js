// The desk's keyboard and small conveniences. A static file, because the Content
// Security Policy allows no inline script. Every page works without it.
(function () {
  "use strict";

  document.documentElement.classList.add("js");

  // The browser's time zone, for the pages of an operator who chose none: sent once, in a
  // cookie the server checks against its zone names (durability/accounts/timezones.py).
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  if (zone && !document.cookie.split("; ").includes(`tallybook_tz=${zone}`)) {
    document.cookie = `tallybook_tz=${zone}; path=/; max-age=31536000; SameSite=Lax`;
  }

  function typing(target) {
    return target.closest && target.closest("input, textarea, select, [contenteditable]");
  }

  // -- the queue ---------------------------------------------------------------------

  function rows() {
    return Array.from(document.querySelectorAll("tr.case-row"));
  }

  // The id of the row the keyboard is on: a row re-rendered by htmx is found again by it.
  let currentId = "";

  function currentRow() {
    return currentId ? document.getElementById(currentId) : null;
  }

  function focusRow(row) {
    if (!row) return;
    const was = document.querySelector("tr.case-row.current");
    if (was) was.classList.remove("current");
    currentId = row.id;
    row.classList.add("current");
    row.focus({ preventScroll: true });
    row.scrollIntoView({ block: "nearest" });
  }

  function move(step) {
    const all = rows();
    if (!all.length) return;
    const at = all.indexOf(currentRow());
    const next = at === -1 ? 0 : at + step;
    if (next >= all.length) {
      // At the end of the page: fetch the next one, if there is one.
      const more = document.querySelector("a[data-more]");
      if (more) more.click();
      return;
    }
    focusRow(all[Math.max(0, next)]);
  }

  function submit(form) {
    if (form) form.requestSubmit();
  }

  function updateSelection() {
    const count = document.querySelectorAll('input[name="case"][form="bulk-form"]:checked').length;
    document.querySelectorAll("[data-selected-count]").forEach(function (el) {
      el.textContent = String(count);
    });
    const scope = document.querySelector(
      '#bulk-form input[name="scope"][value="' + (count ? "selected" : "matching") + '"]'
    );
    if (scope) scope.checked = true;
  }

  function queueKey(event) {
    const row = currentRow();
    switch (event.key) {
      case "j":
        move(1);
        break;
      case "k":
        move(-1);
        break;
      case "o":
      case "Enter":
        if (!row) return false;
        window.location.assign(row.dataset.url);
        break;
      case "r":
        if (!row) return false;
        window.location.assign(row.dataset.url + "#resolve");
        break;
      case "a":
        if (!row) return false;
        submit(row.querySelector("form.assign-me"));
        break;
      case "x": {
        const box = row && row.querySelector('input[name="case"]:not(:disabled)');
        if (!box) return false;
        box.checked = !box.checked;
        updateSelection();
        break;
      }
      case "/": {
        const field = document.querySelector(".queue-filter input[type=text], .queue-filter select");
        if (field) field.focus();
        break;
      }
      default:
        return false;
    }
    return true;
  }

  // -- a case ------------------------------------------------------------------------

  function chooseVerdict(radio) {
    radio.checked = true;
    radio.dispatchEvent(new Event("change", { bubbles: true }));
    const reason = document.querySelector("[data-resolve] [data-reason]");
    const evidence = document.querySelector("[data-evidence] input");
    const first = radio.value === "happened" && evidence ? evidence : reason;
    if (first) first.focus();
  }

  function toggleEvidence() {
    const form = document.querySelector("[data-resolve]");
    const evidence = form && form.querySelector("[data-evidence]");
    if (!evidence) return;
    const chosen = form.querySelector('input[name="verdict"]:checked');
    evidence.hidden = Boolean(chosen) && chosen.value !== "happened";
  }

  function caseKey(event) {
    const radio = document.querySelector('[data-resolve] input[name="verdict"][data-key="' + event.key + '"]');
    if (radio) {
      chooseVerdict(radio);
      return true;
    }
    switch (event.key) {
      case "a":
        submit(document.querySelector(".case-page form.assign-me"));
        break;
      case "m": {
        const comment = document.querySelector("[data-comment]");
        if (!comment) return false;
        comment.focus();
        break;
      }
      case "u": {
        const back = document.querySelector("[data-back]");
        if (back) window.location.assign(back.href);
        break;
      }
      default:
        return false;
    }
    return true;
  }

  // -- wiring ------------------------------------------------------------------------

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (typing(event.target)) {
      if (event.key === "Escape") event.target.blur();
      return;
    }
    let handled = false;
    if (event.key === "?") {
      const keys = document.querySelector("[data-keys]");
      if (keys) keys.open = !keys.open;
      handled = Boolean(keys);
    } else if (document.querySelector("[data-queue]")) {
      handled = queueKey(event);
    } else if (document.querySelector("[data-case]")) {
      handled = caseKey(event);
    }
    if (handled) event.preventDefault();
  });

  document.addEventListener("change", function (event) {
    const target = event.target;
    if (target.matches("select[data-autosubmit]")) submit(target.form);
    if (target.matches("input[data-select-all]")) {
      document.querySelectorAll('input[name="case"][form="bulk-form"]:not(:disabled)').forEach(function (box) {
        box.checked = target.checked;
      });
    }
    if (target.matches('input[name="case"], input[data-select-all]')) updateSelection();
    if (target.matches('[data-resolve] input[name="verdict"]')) toggleEvidence();
  });

  document.addEventListener("click", function (event) {
    const row = event.target.closest && event.target.closest("tr.case-row");
    if (row) focusRow(row);
  });

  // The queue's pulse names the rows this page shows: it sends back only those of them that
  // changed (htmx would have nowhere to put another).
  document.addEventListener("htmx:configRequest", function (event) {
    if (event.detail.elt.id !== "pulse") return;
    event.detail.parameters.shown = rows()
      .map(function (row) {
        return row.id.slice("case-".length);
      })
      .join(".");
  });

  // A row swapped in by htmx (assigned here, or changed elsewhere) keeps the keyboard.
  document.addEventListener("htmx:afterSettle", function () {
    const row = currentRow();
    if (row && !row.classList.contains("current")) focusRow(row);
  });

  document.addEventListener("DOMContentLoaded", function () {
    toggleEvidence();
    if (document.querySelector("[data-queue]")) focusRow(rows()[0]);
    if (window.location.hash === "#resolve") {
      const first = document.querySelector('[data-resolve] input[name="verdict"]');
      if (first) first.focus();
    }
  });
})();
