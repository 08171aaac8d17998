"""Code that runs in the caller (the notebook kernel or a script): handles, results, run hooks,
the console, hang detection, retries, and re-attaching to runs under the original API's names."""
