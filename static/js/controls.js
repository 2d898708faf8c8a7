// Behaviour of plain form controls, kept out of the markup: the Content-Security-Policy allows
// no inline script, event-handler attributes included.
//   <select data-submit-on-change>  submits its form when the choice changes
//   <select data-navigate>          goes to the chosen option's value (a URL)
(function () {
  "use strict";
  document.addEventListener("change", function (event) {
    var control = event.target;
    if (control.matches("select[data-submit-on-change]") && control.form) {
      control.form.submit();
    } else if (control.matches("select[data-navigate]") && control.value) {
      window.location.href = control.value;
    }
  });
})();
