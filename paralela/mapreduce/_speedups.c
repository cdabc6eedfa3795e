/* paralela.mapreduce._speedups: the hot loop of a map task with a combiner, compiled.
 *
 * count_runs(runs, it, one, other, budget, seen) does what the Python loop of
 * paralela/mapreduce/_counting.py (count_runs_python) does, with the same results and
 * the same exceptions; its docstring is the contract. Tally is the count it keeps, the
 * value type of a runs dict (_counting.TallyPython is the same in Python).
 *
 * A word count's natural mapper (`for w in line.split(): yield w, 1`) spends about
 * 0.17 s of CPU a million pairs in that Python loop beside 0.15 s in the mapper itself;
 * here the loop costs about a third of that (bench/results/mapreduce.md, issue 27). With
 * Tally values a counted pair is one dict lookup and an increment: over 1.67M prebuilt
 * pairs of the benchmark's corpus 0.11 s of CPU, against 0.17 s with int values (a
 * lookup, a new int past 256, and a second lookup to store it).
 *
 * Only public CPython API is used (3.10 and later).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Unpack `kv` into two new references, as `k, v = kv` does (same errors). */
static int
unpack2(PyObject *kv, PyObject **k, PyObject **v)
{
    if (PyTuple_CheckExact(kv) && PyTuple_GET_SIZE(kv) == 2) {
        *k = Py_NewRef(PyTuple_GET_ITEM(kv, 0));
        *v = Py_NewRef(PyTuple_GET_ITEM(kv, 1));
        return 0;
    }
    if (PyList_CheckExact(kv) && PyList_GET_SIZE(kv) == 2) {
        *k = Py_NewRef(PyList_GET_ITEM(kv, 0));
        *v = Py_NewRef(PyList_GET_ITEM(kv, 1));
        return 0;
    }
    PyObject *items = PySequence_Fast(kv, "");
    if (items == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Format(PyExc_TypeError, "cannot unpack non-iterable %.200s object",
                         Py_TYPE(kv)->tp_name);
        }
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    if (n != 2) {
        if (n < 2) {
            PyErr_Format(PyExc_ValueError,
                         "not enough values to unpack (expected 2, got %zd)", n);
        }
        else {
            PyErr_SetString(PyExc_ValueError, "too many values to unpack (expected 2)");
        }
        Py_DECREF(items);
        return -1;
    }
    *k = Py_NewRef(PySequence_Fast_GET_ITEM(items, 0));
    *v = Py_NewRef(PySequence_Fast_GET_ITEM(items, 1));
    Py_DECREF(items);
    return 0;
}

/* A key's count in a runs dict: a mutable cell, so that counting a pair is one dict
 * lookup and an increment in place (an int value costs a second lookup to store the
 * sum, and a new int object past 256). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
} TallyObject;

static PyTypeObject TallyType;

static PyObject *
tally_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"n", NULL};
    Py_ssize_t n = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n:Tally", kwlist, &n)) {
        return NULL;
    }
    TallyObject *self = (TallyObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->n = n;
    }
    return (PyObject *)self;
}

static PyObject *
tally_get_n(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(((TallyObject *)self)->n);
}

static int
tally_set_n(PyObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a Tally's n cannot be deleted");
        return -1;
    }
    Py_ssize_t n = PyLong_AsSsize_t(value);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    ((TallyObject *)self)->n = n;
    return 0;
}

static PyObject *
tally_repr(PyObject *self)
{
    return PyUnicode_FromFormat("Tally(%zd)", ((TallyObject *)self)->n);
}

static PyGetSetDef tally_getset[] = {
    {"n", tally_get_n, tally_set_n, "the count", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TallyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "paralela.mapreduce._speedups.Tally",
    .tp_basicsize = sizeof(TallyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Tally(n=0): a mutable count (a runs dict's value).",
    .tp_new = tally_new,
    .tp_repr = tally_repr,
    .tp_getset = tally_getset,
};

/* runs[k].n += 1, or runs[k] = Tally(1) for a new key. */
static int
count(PyObject *runs, PyObject *k)
{
    PyObject *t = PyDict_GetItemWithError(runs, k); /* borrowed */
    if (t != NULL && Py_IS_TYPE(t, &TallyType)) {
        ((TallyObject *)t)->n++;
        return 0;
    }
    if (t != NULL) {
        PyErr_Format(PyExc_TypeError, "count_runs() counts in Tally values, not %.200s",
                     Py_TYPE(t)->tp_name);
        return -1;
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    TallyObject *one = PyObject_New(TallyObject, &TallyType);
    if (one == NULL) {
        return -1;
    }
    one->n = 1;
    int rc = PyDict_SetItem(runs, k, (PyObject *)one);
    Py_DECREF(one);
    return rc;
}

static PyObject *
count_runs(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "count_runs() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *runs = args[0], *it = args[1], *one = args[2], *other = args[3];
    PyObject *seen = args[5];
    if (!PyDict_CheckExact(runs) || !PyList_CheckExact(seen) || PyList_GET_SIZE(seen) < 1) {
        PyErr_SetString(PyExc_TypeError,
                        "count_runs() takes a dict of runs and a list of one item");
        return NULL;
    }
    Py_ssize_t budget = PyLong_AsSsize_t(args[4]);
    if (budget == -1 && PyErr_Occurred()) {
        return NULL;
    }
    iternextfunc next = Py_TYPE(it)->tp_iternext;
    if (next == NULL || !PyIter_Check(it)) {
        PyErr_Format(PyExc_TypeError, "count_runs() takes an iterator, not %.200s",
                     Py_TYPE(it)->tp_name);
        return NULL;
    }
    PyObject *last = NULL; /* the last item pulled from `it` */
    int failed = 0;
    for (Py_ssize_t i = 0; i < budget; i++) {
        PyObject *kv = next(it);
        if (kv == NULL) {
            if (PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_StopIteration)) {
                    failed = 1;
                    break;
                }
                PyErr_Clear();
            }
            break;
        }
        Py_XSETREF(last, kv);
        PyObject *k, *v;
        if (unpack2(kv, &k, &v) < 0) {
            failed = 1;
            break;
        }
        int rc;
        if (v == one) {
            rc = count(runs, k);
        }
        else {
            PyObject *call[2] = {k, v};
            PyObject *r = PyObject_Vectorcall(other, call, 2, NULL);
            rc = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc < 0) {
            failed = 1;
            break;
        }
    }
    if (last != NULL) {
        /* seen[0] = last, keeping any exception raised above */
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        int rc = PyList_SetItem(seen, 0, last); /* steals `last` */
        PyErr_Restore(exc_type, exc_value, exc_tb);
        if (rc < 0 && !failed) {
            return NULL;
        }
    }
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"count_runs", (PyCFunction)(void (*)(void))count_runs, METH_FASTCALL,
     "count_runs(runs, it, one, other, budget, seen): see count_runs_python."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "paralela.mapreduce._speedups",
    "The hot loop of a map task with a combiner, compiled (see _counting).", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&TallyType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Tally", (PyObject *)&TallyType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
