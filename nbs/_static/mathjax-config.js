// MathJax 2, served with the site (overrides/hooks.py copies it from jupyter-server-mathjax): the pages carry their
// maths as <script type="math/tex"> (the hook converts nbconvert's $…$), typeset here with the STIX fonts it ships.
window.MathJax = {
  config: ['TeX-AMS-MML_HTMLorMML-full.js'],
  'HTML-CSS': {availableFonts: ['STIX-Web'], preferredFont: 'STIX-Web', webFont: 'STIX-Web', imageFont: null,
               linebreaks: {automatic: true}},
  messageStyle: 'none',
};
