/* The status page: poll status.json and redraw the progress until it reaches a final state. */
(function () {
  "use strict";

  var root = document.getElementById("progress");
  if (!root || root.getAttribute("data-final") === "true" || !window.fetch) {
    return;
  }
  var url = root.getAttribute("data-status-url");
  var headline = document.getElementById("status-headline");
  var message = document.getElementById("status-message");
  var list = document.getElementById("steps");
  var details = document.getElementById("status-details");
  var lastDetails = "";
  var FAST_MS = 1000;
  var SLOW_MS = 5000;
  var MAX_MS = 30000;
  var polls = 0;
  var delay = FAST_MS;
  var lastSteps = "";

  function stepItem(step) {
    var li = document.createElement("li");
    li.className = "step step--" + step.state;
    var icon = document.createElement("span");
    icon.className = "step__icon";
    icon.setAttribute("aria-hidden", "true");
    var label = document.createElement("span");
    label.className = "step__label";
    label.textContent = step.label;
    var state = document.createElement("span");
    state.className = "step__state";
    state.textContent = step.state_label;
    li.appendChild(icon);
    li.appendChild(label);
    li.appendChild(state);
    return li;
  }

  function render(customer) {
    // Only touch what changed: a rewritten live region is read out again.
    if (headline.textContent !== customer.headline) {
      headline.textContent = customer.headline;
    }
    if (message.textContent !== customer.message) {
      message.textContent = customer.message;
    }
    root.className = "progress progress--" + customer.outcome;
    var facts = JSON.stringify(customer.details || []);
    if (details && facts !== lastDetails) {
      lastDetails = facts;
      var items = document.createDocumentFragment();
      (customer.details || []).forEach(function (line) {
        var li = document.createElement("li");
        li.textContent = line;
        items.appendChild(li);
      });
      details.replaceChildren(items);
      details.hidden = !(customer.details || []).length;
    }
    var steps = JSON.stringify(customer.steps);
    if (steps !== lastSteps) {
      lastSteps = steps;
      var fragment = document.createDocumentFragment();
      customer.steps.forEach(function (step) {
        fragment.appendChild(stepItem(step));
      });
      list.replaceChildren(fragment);
    }
  }

  function schedule() {
    window.setTimeout(poll, delay);
  }

  function poll() {
    polls += 1;
    fetch(url, { headers: { Accept: "application/json" }, cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("status " + response.status);
        }
        return response.json();
      })
      .then(function (data) {
        render(data.customer);
        if (data.customer.final) {
          root.setAttribute("data-final", "true");
          return;
        }
        // Most requests finish within a minute; after that, ask less often.
        delay = polls < 90 ? FAST_MS : SLOW_MS;
        schedule();
      })
      .catch(function () {
        // Offline or a server hiccup: back off, keep the last good view on screen.
        delay = Math.min(delay * 2, MAX_MS);
        schedule();
      });
  }

  schedule();
})();
