/* The rebooking form: bring errors into view, and count the message's characters. */
(function () {
  "use strict";

  var summary = document.getElementById("error-summary");
  if (summary) {
    summary.focus();
  }

  var message = document.getElementById("id_message");
  var counter = document.getElementById("id_message_counter");
  if (!message || !counter) {
    return;
  }
  var limit = parseInt(message.getAttribute("data-max-chars"), 10) || 5000;

  function update() {
    // Line breaks are sent as two characters but counted as one, as the server does.
    var used = message.value.replace(/\r\n/g, "\n").length;
    var left = limit - used;
    counter.hidden = false;
    counter.textContent = left >= 0
      ? left.toLocaleString() + " characters left"
      : (-left).toLocaleString() + " characters too many";
    counter.classList.toggle("field__counter--over", left < 0);
  }

  message.addEventListener("input", update);
  update();
})();
