/* The rebooking form: bring errors into view, and count the characters of its text boxes. */
(function () {
  "use strict";

  var summary = document.getElementById("error-summary");
  if (summary) {
    summary.focus();
  }

  // Every box with a limit (the message, the waiver's details) has a counter below it.
  Array.prototype.forEach.call(document.querySelectorAll("textarea[data-max-chars]"), function (box) {
    var counter = document.getElementById(box.id + "_counter");
    if (!counter) {
      return;
    }
    var limit = parseInt(box.getAttribute("data-max-chars"), 10) || 5000;

    function update() {
      // Line breaks are sent as two characters but counted as one, as the server does.
      var used = box.value.replace(/\r\n/g, "\n").length;
      var left = limit - used;
      counter.hidden = false;
      counter.textContent = left >= 0
        ? left.toLocaleString() + " characters left"
        : (-left).toLocaleString() + " characters too many";
      counter.classList.toggle("field__counter--over", left < 0);
    }

    box.addEventListener("input", update);
    update();
  });
})();
