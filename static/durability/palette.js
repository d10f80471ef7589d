// The command palette: Ctrl+K (Cmd+K on a Mac) anywhere opens it; typing asks the search
// page for its list (htmx, `palette=1`); the arrows choose, Enter follows, Esc closes.
// A static file, as the Content Security Policy allows no inline script.
(function () {
  "use strict";

  function palette() {
    return document.querySelector("dialog[data-palette]");
  }

  function options() {
    const dialog = palette();
    return dialog ? Array.from(dialog.querySelectorAll("#palette-results a")) : [];
  }

  // The chosen option: marked, and said to assistive technology.
  function choose(index) {
    const all = options();
    all.forEach(function (a, i) {
      a.classList.toggle("chosen", i === index);
      a.setAttribute("aria-selected", String(i === index));
    });
    if (all[index]) all[index].scrollIntoView({ block: "nearest" });
  }

  function chosenIndex() {
    return options().findIndex(function (a) {
      return a.classList.contains("chosen");
    });
  }

  function open() {
    const dialog = palette();
    if (!dialog) return;
    if (!dialog.open) dialog.showModal();
    const input = dialog.querySelector("[data-palette-input]");
    input.select();
    // The list for what is typed already (the pages and views, when nothing is).
    window.htmx.trigger(input, "palette-open");
  }

  document.addEventListener("keydown", function (event) {
    const dialog = palette();
    if (!dialog) return;
    if ((event.ctrlKey || event.metaKey) && !event.altKey && event.key.toLowerCase() === "k") {
      event.preventDefault();
      event.stopImmediatePropagation();
      if (dialog.open) dialog.close();
      else open();
      return;
    }
    if (!dialog.open || !dialog.contains(event.target)) return;
    const count = options().length;
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      if (!count) return;
      const step = event.key === "ArrowDown" ? 1 : -1;
      choose((chosenIndex() + step + count) % count);
    } else if (event.key === "Enter" && event.target.matches("[data-palette-input]")) {
      const chosen = options()[Math.max(0, chosenIndex())];
      if (chosen) {
        event.preventDefault();
        window.location.assign(chosen.href);
      }
    }
  }, true);

  // A new list: its first option is chosen, so Enter goes there.
  document.addEventListener("htmx:afterSwap", function (event) {
    if (event.detail.target.id === "palette-results") choose(0);
  });
})();
