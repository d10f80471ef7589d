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

  // Whether keys typed at `target` are text (a radio button or a checkbox takes none: the
  // verdict `r` lands on still answers the case's keys).
  function typing(target) {
    const field = "input:not([type=radio]):not([type=checkbox]), textarea, select, [contenteditable]";
    return target.closest && target.closest(field);
  }

  // -- the queue ---------------------------------------------------------------------

  // The rows j/k move through: the queue's cases, or the approvals waiting.
  function rows() {
    return Array.from(document.querySelectorAll("tr.case-row, tr.approval-row"));
  }

  // The id of the row the keyboard is on: a row re-rendered by htmx is found again by it.
  let currentId = "";

  function currentRow() {
    return currentId ? document.getElementById(currentId) : null;
  }

  function focusRow(row) {
    if (!row) return;
    const was = document.querySelector("tr.current");
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

  // The bulk form's boxes: cases, and in the grouped queue groups (counting their cases).
  const BOXES = 'input[name="case"][form="bulk-form"], input[name="case_group"][form="bulk-form"]';

  function updateSelection() {
    let count = 0;
    document.querySelectorAll(BOXES).forEach(function (box) {
      if (box.checked) count += Number(box.dataset.count || 1);
    });
    document.querySelectorAll("[data-selected-count]").forEach(function (el) {
      el.textContent = String(count);
    });
    // Ticking a row chooses the ticked rows; "all N matching" is only ever chosen by hand.
    const scope = count && document.querySelector('#bulk-form input[name="scope"][value="selected"]');
    if (scope) scope.checked = true;
  }

  function queueKey(event) {
    if (rowsKey(event)) return true;
    const row = currentRow();
    switch (event.key) {
      case "r":
        // To the case's first verdict (#verdict, a radio button): the browser focuses the
        // element a fragment names when it can be focused, and clears the focus otherwise,
        // after any script has run, which would undo focusing it from here.
        if (!row) return false;
        window.location.assign(row.dataset.url + "#verdict");
        break;
      case "a":
        if (!row) return false;
        submit(row.querySelector("form.assign-me"));
        break;
      case "x": {
        const box = row && row.querySelector('input[name="case"]:not(:disabled), input[name="case_group"]');
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
      case "u":
        return follow("[data-back]");
      case "s":
        return follow("[data-next]");
      default:
        return false;
    }
    return true;
  }

  // Follow the page's link `selector`, if it has one.
  function follow(selector) {
    const link = document.querySelector(selector);
    if (!link) return false;
    window.location.assign(link.href);
    return true;
  }

  // -- approvals ---------------------------------------------------------------------

  // The keys of any list of rows (the queue's cases, the approvals waiting): move, open.
  function rowsKey(event) {
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
      default:
        return false;
    }
    return true;
  }

  function approvalKey(event) {
    const verdict = { a: "approve", d: "deny" }[event.key];
    const radio = verdict && document.querySelector('.sign-form input[name="verdict"][value="' + verdict + '"]');
    if (radio) {
      radio.checked = true;
      const reason = document.querySelector('.sign-form [name="reason"]');
      if (reason) reason.focus();
      return true;
    }
    if (event.key === "u") return follow("[data-back]");
    return false;
  }

  // -- everywhere: the help and the go-to keys -----------------------------------------

  function help() {
    return document.querySelector("dialog[data-keys]");
  }

  function toggleHelp() {
    const dialog = help();
    if (!dialog) return false;
    if (dialog.open) dialog.close();
    else dialog.showModal();
    return true;
  }

  // After `g`, the next key names a page: the header's link that carries it (data-go).
  let going = false;
  let goingTimer = 0;

  function goKey(event) {
    if (going) {
      going = false;
      window.clearTimeout(goingTimer);
      return follow('a[data-go="' + event.key + '"]') || true;
    }
    if (event.key !== "g") return false;
    going = true;
    // A `g` not followed by a page's key soon is forgotten.
    goingTimer = window.setTimeout(function () {
      going = false;
    }, 1500);
    return true;
  }

  // -- wiring ------------------------------------------------------------------------

  // Keys typed in a field: Shift+Enter in the case's resolve form settles and goes on to the
  // next case; Ctrl+Enter in an approval's reason signs; Escape leaves the field.
  function fieldKey(event) {
    const target = event.target;
    if (event.key === "Escape") {
      target.blur();
      return false;
    }
    if (event.key !== "Enter") return false;
    const resolve = target.closest("[data-resolve]");
    if (resolve && event.shiftKey && target.matches("input")) {
      resolve.requestSubmit(resolve.querySelector("[data-then-next]"));
      return true;
    }
    const sign = target.closest(".sign-form");
    if (sign && (event.ctrlKey || event.metaKey)) {
      sign.requestSubmit();
      return true;
    }
    return false;
  }

  document.addEventListener("keydown", function (event) {
    if (typing(event.target)) {
      if (fieldKey(event)) event.preventDefault();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    let handled = false;
    const dialog = help();
    if (event.key === "?") {
      handled = toggleHelp();
    } else if (dialog && dialog.open) {
      return; // the help is over the page: its keys wait (Esc closes it)
    } else if (goKey(event)) {
      handled = true;
    } else if (document.querySelector("[data-queue]")) {
      handled = queueKey(event);
    } else if (document.querySelector("[data-case]")) {
      handled = caseKey(event);
    } else if (document.querySelector("[data-approvals]")) {
      handled = rowsKey(event);
    } else if (document.querySelector("[data-approval]")) {
      handled = approvalKey(event);
    }
    if (!handled && event.key === "/") handled = focusSearch();
    if (handled) event.preventDefault();
  });

  // -- search: `/` focuses the header's box (the queue's own `/` focuses its filter) --------

  function focusSearch() {
    const box = document.querySelector("input[data-search]");
    if (!box) return false;
    box.focus();
    box.select();
    return true;
  }

  document.addEventListener("change", function (event) {
    const target = event.target;
    if (target.matches("select[data-autosubmit]")) submit(target.form);
    if (target.matches("input[data-select-all]")) {
      document.querySelectorAll(BOXES).forEach(function (box) {
        if (!box.disabled) box.checked = target.checked;
      });
    }
    if (target.matches('input[name="case"], input[name="case_group"], input[data-select-all]')) updateSelection();
    if (target.matches('[data-resolve] input[name="verdict"]')) toggleEvidence();
  });

  // The header's menu at phone width: opens and closes its links, search and account.
  function toggleMenu(button) {
    const header = button.closest("header.top");
    const open = !header.classList.contains("open");
    header.classList.toggle("open", open);
    button.setAttribute("aria-expanded", String(open));
  }

  document.addEventListener("click", function (event) {
    const menu = event.target.closest && event.target.closest("[data-menu]");
    if (menu) toggleMenu(menu);
    const row = event.target.closest && event.target.closest("tr.case-row, tr.approval-row");
    if (row) focusRow(row);
    if (event.target.closest && event.target.closest("[data-keys-open]")) toggleHelp();
  });

  // The queue's pulse names the rows this page shows: it sends back only those of them that
  // changed (htmx would have nowhere to put another).
  document.addEventListener("htmx:configRequest", function (event) {
    if (event.detail.elt.id !== "pulse") return;
    event.detail.parameters.shown = rows()
      .filter(function (row) {
        return row.id.startsWith("case-");
      })
      .map(function (row) {
        return row.id.slice("case-".length);
      })
      .join(".");
  });

  // A group of the grouped queue expands to its cases, and collapses again.
  document.addEventListener("htmx:beforeRequest", function (event) {
    const link = event.detail.elt;
    if (!link.matches("[data-expand]")) return;
    const cases = document.getElementById(link.getAttribute("aria-controls"));
    if (cases && cases.children.length) {
      event.preventDefault();
      cases.replaceChildren();
      link.setAttribute("aria-expanded", "false");
    }
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    const cases = event.detail.target;
    if (!cases.classList.contains("group-cases")) return;
    const link = document.querySelector('[data-expand][aria-controls="' + cases.id + '"]');
    if (link) link.setAttribute("aria-expanded", "true");
  });

  // A row swapped in by htmx (assigned here, or changed elsewhere) keeps the keyboard.
  document.addEventListener("htmx:afterSettle", function () {
    const row = currentRow();
    if (row && !row.classList.contains("current")) focusRow(row);
  });

  document.addEventListener("DOMContentLoaded", function () {
    toggleEvidence();
    if (document.querySelector("[data-queue], [data-approvals]")) focusRow(rows()[0]);
  });
})();
