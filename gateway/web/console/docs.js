// Swagger UI over this gateway's /openapi.json. An external file because the Content-Security-Policy
// forbids inline script. "Authorize" takes the bearer token (kept in memory by Swagger UI); a token
// the console holds in this tab's session storage is pre-filled, so "try it" works at once.
window.addEventListener("load", () => {
  const ui = window.SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: false,
    tryItOutEnabled: true,
    persistAuthorization: false,
    onComplete: () => {
      const token = sessionStorage.getItem("mnemo.token");
      if (token) ui.preauthorizeApiKey("bearer", token);
    },
  });
  window.ui = ui;
});
