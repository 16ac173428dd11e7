"""The rewrite engine (graphpass.infra.rewrite): match, refuse with a reason, rewrite, rewiring,
dead-node removal, composition, per-rule counts, subgraphs, one linear walk."""

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes.framework import PassContext, PassKind
from graphpass.passes.framework.registry import get_pass, unregister
from graphpass.passes.framework.rewrite import Match, MatchResult, Rule, RulePass, RuleSet, apply_rules, rule, rule_pass
from graphpass.testing import assert_equivalent, make_model, ops, ort_run

F = TensorProto.FLOAT
SPECIALS = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -1.5, 1e-45, 3.4028235e38], np.float32)


class ReluRelu(Rule):
    pattern = ("Relu", "Relu")

    def rewrite(self, m, ctx):
        return m.op("Relu", [m.nodes[0].inputs[0]])


def _relu_chain(n: int, out: str = "y"):
    names = ["x"] + [f"t{i}" for i in range(n - 1)] + [out]
    return make_model([helper.make_node("Relu", [names[i]], [names[i + 1]]) for i in range(n)],
                      {"x": [8]}, {out: [8]})


def _sorted(graph: gs.Graph) -> bool:
    seen = {id(t) for t in graph.inputs} | {id(t) for n in graph.nodes for t in n.inputs if isinstance(t, gs.Constant)}
    for n in graph.nodes:
        if any(t.name and id(t) not in seen and t.inputs for t in n.inputs):
            return False
        seen.update(id(t) for t in n.outputs)
    return True


def test_match_and_rewrite_keep_the_output_name_and_values():
    model = _relu_chain(2)
    graph = gp.load(model).graph
    P = rule_pass("t_relu_relu", ReluRelu())
    result = P().apply(graph, PassContext())
    assert result.modified and result.stats["fired"] == 1
    assert ops(graph) == ["Relu"] and graph.nodes[0].outputs[0].name == "y"
    assert graph.nodes[0].inputs[0] is graph.inputs[0]
    assert result.stats["rules"]["relu_relu"] == {"matched": 1, "refused": 0, "rewritten": 1, "removed": 2, "created": 1}
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIALS}, exact=True)


def test_refusal_gives_the_reason_and_leaves_the_graph():
    class Never(ReluRelu):
        def check(self, m, ctx):
            return MatchResult.fail("not today")

    graph = gp.load(_relu_chain(3)).graph
    ctx = PassContext()
    result = rule_pass("t_never", Never())().apply(graph, ctx)
    assert not result.modified and ops(graph) == ["Relu", "Relu", "Relu"]
    assert result.stats["refused"] == 2 and result.stats["rules"]["never"]["matched"] == 2
    assert [(e.pass_name, e.reason) for e in ctx.explanations] == [("t_never", "not today")] * 2


def test_a_refused_rule_lets_the_next_rule_fire():
    second = rule(("Relu", "Relu"), lambda m: m.nodes[0].outputs[0], name="second")  # Relu(Relu(x)) -> Relu(x), in place
    first = rule(("Relu", "Relu"), lambda m: None, check=lambda m: "first refuses", name="first")
    graph = gp.load(_relu_chain(2)).graph
    counts = apply_rules(graph, RuleSet(first, second), PassContext(), "t")
    assert counts["first"]["refused"] == 1 and counts["second"]["rewritten"] == 1
    assert ops(graph) == ["Relu"] and graph.nodes[0].outputs[0].name == "y"


def test_rule_sets_compose_flat_and_in_order():
    a, b, c = (rule(("Relu",), lambda m: None, name=n) for n in "abc")
    s = RuleSet(a) + RuleSet(RuleSet(b), [c])
    assert [r.label for r in s] == ["a", "b", "c"]
    assert [r.label for r in a + RuleSet(b, c)] == ["a", "b", "c"]  # a rule on the left of a set
    assert [r.label for r in RuleSet(s, a)] == ["a", "b", "c", "a"]
    with pytest.raises(TypeError):
        RuleSet(42)


def test_earlier_rule_wins_at_an_anchor():
    calls = []
    one = rule(("Relu", "Relu"), lambda m: calls.append("one") or m.op("Relu", [m.nodes[0].inputs[0]]), name="one")
    two = rule(("Relu", "Relu"), lambda m: calls.append("two") or m.nodes[0].outputs[0], name="two")
    graph = gp.load(_relu_chain(2)).graph
    counts = apply_rules(graph, RuleSet(one, two), PassContext(), "t")
    assert calls == ["one"] and counts["two"]["matched"] == 0


def test_existing_tensor_replacing_an_internal_tensor_rewires_readers():
    model = make_model([helper.make_node("Mul", ["x", "one"], ["a"]), helper.make_node("Neg", ["a"], ["y"])],
                       {"x": [4]}, {"y": [4]}, initializers={"one": np.array(1.0, np.float32)})
    graph = gp.load(model).graph
    counts = apply_rules(graph, [rule(("Mul",), lambda m: m.anchor.inputs[0], name="times_one")], PassContext(), "t")
    assert counts["times_one"]["removed"] == 1 and ops(graph) == ["Neg"]
    assert graph.nodes[0].inputs[0] is graph.inputs[0]
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIALS[:4]}, exact=True)


def test_graph_output_taken_over_by_the_producer_of_the_existing_tensor():
    model = make_model([helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Mul", ["a", "one"], ["y"])],
                       {"x": [4]}, {"y": [4]}, initializers={"one": np.array(1.0, np.float32)})
    graph = gp.load(model).graph
    apply_rules(graph, [rule(("Mul",), lambda m: m.anchor.inputs[0])], PassContext(), "t")
    assert ops(graph) == ["Neg"] and graph.nodes[0].outputs[0].name == "y" and graph.outputs[0].name == "y"
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIALS[:4]}, exact=True)


def test_graph_output_that_no_tensor_can_take_over_is_refused_with_the_reason():
    model = make_model([helper.make_node("Mul", ["x", "one"], ["y"])], {"x": [4]}, {"y": [4]},
                       initializers={"one": np.array(1.0, np.float32)})
    graph = gp.load(model).graph
    ctx = PassContext()

    def rewrite(m):
        m.op("Neg", [m.anchor.inputs[0]])  # built, then abandoned: must not stay a reader of x
        return m.anchor.inputs[0]

    counts = apply_rules(graph, [rule(("Mul",), rewrite, name="times_one")], ctx, "t")
    assert counts["times_one"] == {"matched": 1, "refused": 1, "rewritten": 0, "removed": 0, "created": 0}
    assert "'y' is a graph output and 'x' cannot take its name" in ctx.explanations[0].reason
    assert ops(graph) == ["Mul"] and [n.op for n in graph.inputs[0].outputs] == ["Mul"]


def test_a_matched_node_still_read_elsewhere_stays():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"]),
                        helper.make_node("Neg", ["a"], ["z"])], {"x": [4]}, {"y": [4], "z": [4]})

    class Shared(ReluRelu):
        exclusive = False

    graph = gp.load(model).graph
    assert apply_rules(graph, [ReluRelu()], PassContext(), "t")["relu_relu"]["matched"] == 0  # exclusive: no match
    counts = apply_rules(graph, [Shared()], PassContext(), "t")
    assert counts["shared"]["removed"] == 1 and sorted(ops(graph)) == ["Neg", "Relu", "Relu"]
    assert _sorted(graph)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIALS[:4]}, exact=True)


def test_multi_output_anchor_gets_one_value_per_output_and_none_keeps_one():
    model = make_model([helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2),
                        helper.make_node("Neg", ["a"], ["y"]), helper.make_node("Neg", ["b"], ["z"])],
                       {"x": [4]}, {"y": [2], "z": [2]}, opset=18)
    graph = gp.load(model).graph

    def halves(m):
        x = m.anchor.inputs[0]
        lo = m.op("Slice", [x, gs.Constant("s0", np.array([0])), gs.Constant("e0", np.array([2]))])
        return [lo, None]

    counts = apply_rules(graph, [rule(("Split",), halves, name="halves")], PassContext(), "t")
    assert counts["halves"]["rewritten"] == 1 and counts["halves"]["removed"] == 0  # b still read: the Split stays
    assert sorted(ops(graph)) == ["Neg", "Neg", "Slice", "Split"] and _sorted(graph)
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_per_match_counts_reach_the_pass_stats_only_when_applied():
    class Counting(ReluRelu):
        def rewrite(self, m, ctx):
            m.count("seen")
            return super().rewrite(m, ctx)

    graph = gp.load(_relu_chain(3)).graph
    counts = apply_rules(graph, [Counting()], PassContext(), "t")
    assert counts["counting"]["seen"] == counts["counting"]["rewritten"] == 2 and counts.total("seen") == 2
    assert repr(counts) == "counting 2/2"


def _loop_model():
    body = helper.make_graph(
        [helper.make_node("Relu", ["v"], ["r1"]), helper.make_node("Relu", ["r1"], ["r2"]),
         helper.make_node("Identity", ["c"], ["c_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", F, [4])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("r2", F, [4])])
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["p"]), helper.make_node("Relu", ["p"], ["q"])], "then",
                             [], [helper.make_tensor_value_info("q", F, [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["n"])], "else", [], [helper.make_tensor_value_info("n", F, [4])])
    nodes = [helper.make_node("Loop", ["trips", "cond", "x"], ["looped"], body=body),
             helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Add", ["looped", "y"], ["z"])]
    return make_model(nodes, {"x": [4], "flag": (TensorProto.BOOL, [])}, {"z": [4]},
                      initializers={"trips": np.array(3, np.int64), "cond": np.array(True)})


def test_rules_apply_inside_loop_and_if_bodies():
    model = _loop_model()
    graph = gp.load(model).graph
    counts = apply_rules(graph, [ReluRelu()], PassContext(), "t")
    assert counts["relu_relu"]["rewritten"] == 2
    loop, cond = graph.nodes[0], graph.nodes[1]
    assert ops(loop.attrs["body"]) == ["Relu", "Identity"] and ops(cond.attrs["then_branch"]) == ["Relu"]
    for flag in (True, False):
        assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIALS[:4], "flag": np.array(flag)}, exact=True)


def test_a_chain_of_n_matches_is_rewritten_in_one_linear_walk():
    """Relu^n collapses to one Relu in one application: each node is offered to the rule once
    (a new node is matched as the producer of the next anchor, never rescanned)."""
    n = 400
    calls = []

    class Probe(ReluRelu):
        def match(self, anchor, scope):
            calls.append(anchor)
            return super().match(anchor, scope)

    model = _relu_chain(n)
    graph = gp.load(model).graph
    counts = apply_rules(graph, [Probe()], PassContext(), "t")
    assert len(calls) == n and counts["probe"]["rewritten"] == n - 1
    assert ops(graph) == ["Relu"] and graph.nodes[0].outputs[0].name == "y"
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.resize(SPECIALS, 8)}, exact=True)


def test_many_independent_matches_in_one_walk_keep_topological_order():
    n = 200
    nodes, outs = [], {}
    for i in range(n):
        nodes += [helper.make_node("Relu", ["x"], [f"a{i}"]), helper.make_node("Relu", [f"a{i}"], [f"b{i}"]),
                  helper.make_node("Neg", [f"b{i}"], [f"y{i}"])]
        outs[f"y{i}"] = [8]
    model = make_model(nodes, {"x": [8]}, outs)
    graph = gp.load(model).graph
    calls = []

    class Probe(ReluRelu):
        def match(self, anchor, scope):
            calls.append(anchor)
            return super().match(anchor, scope)

    P = rule_pass("t_probe", Probe())
    result = P().apply(graph, PassContext())
    assert result.stats["fired"] == n and len(calls) == 2 * n
    assert ops(graph).count("Relu") == n and _sorted(graph)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.resize(SPECIALS, 8)}, exact=True)


def test_reverse_walk_lets_the_consumer_most_match_win():
    # Relu(Relu(Relu(x))): forward, (1,2) then (new,3); reverse, (2,3) first and 1 stays as the producer
    seen = []

    class Log(ReluRelu):
        def rewrite(self, m, ctx):
            seen.append(m.anchor.outputs[0].name)
            return super().rewrite(m, ctx)

    graph = gp.load(_relu_chain(3)).graph
    apply_rules(graph, [Log()], PassContext(), "t", reverse=True)
    assert seen == ["y"] and ops(graph) == ["Relu", "Relu"] and _sorted(graph)


def test_rule_pass_registers_like_any_pass_and_runs_in_optimize():
    cls = rule_pass("t_user_relu_relu", RuleSet(ReluRelu()), kind=PassKind.CLEANUP, register=True)
    try:
        assert get_pass("t_user_relu_relu") is cls and issubclass(cls, RulePass) and cls.promise.exact
        model = _relu_chain(4)
        result = gp.optimize(model, passes=["t_user_relu_relu"])
        assert ops(result.graph) == ["Relu"]
        assert_equivalent(model, gp.to_proto(result.graph), feeds={"x": np.resize(SPECIALS, 8)}, exact=True)
    finally:
        unregister("t_user_relu_relu")


def test_a_rule_pass_subclass_works_and_match_result_keeps_its_old_import_paths():
    from graphpass.passes.framework import MatchResult as FromInfra
    from graphpass.passes.framework.pass_base import MatchResult as FromPassBase

    assert FromPassBase is MatchResult and FromInfra is MatchResult

    class Mine(RulePass):
        name = "t_mine"
        summary = "test"
        kind = PassKind.CLEANUP
        promise = gp.infra.pass_base.EXACT
        rules = (ReluRelu(),)

    graph = gp.load(_relu_chain(2)).graph
    assert Mine().apply(graph, PassContext()).stats["fired"] == 1 and ops(graph) == ["Relu"]


def test_a_rewrite_returning_too_many_values_is_a_rule_bug_and_leaves_no_half_built_node():
    graph = gp.load(_relu_chain(1)).graph

    def two(m):
        m.op("Neg", [m.anchor.inputs[0]])
        return [m.anchor.inputs[0]] * 2

    with pytest.raises(TypeError, match="2 values for 1 outputs"):
        apply_rules(graph, [rule(("Relu",), two)], PassContext(), "t")
    assert ops(graph) == ["Relu"] and [n.op for n in graph.inputs[0].outputs] == ["Relu"]


def test_match_is_a_plain_record_of_the_nodes():
    graph = gp.load(_relu_chain(2)).graph
    from graphpass.passes.framework.rewrite import Scope
    from graphpass.ir.graph import NameGen

    scope = Scope(graph, graph, NameGen(graph))
    m = ReluRelu().match(graph.nodes[1], scope)
    assert isinstance(m, Match) and m.nodes == graph.nodes and m.anchor is graph.nodes[1] and m.writes_graph_output()
    assert ReluRelu().match(graph.nodes[0], scope) is None


def test_a_rewrite_reading_a_later_tensor_still_leaves_the_graph_sorted():
    """The new nodes go where the anchor was; a rule that reads a tensor written after it (here:
    the Neg below the anchor) gets the graph re-sorted rather than an unsorted one."""
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                        helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Add", ["b", "n"], ["y"])],
                       {"x": [4]}, {"y": [4]})
    graph = gp.load(model).graph

    def odd(m):  # not a meaningful rewrite: its new nodes read n, written after the anchor
        n = next(t for t in graph.tensors().values() if t.name == "n")
        s = m.op("Add", [m.nodes[0].inputs[0], n])
        return m.op("Sub", [s, n])

    apply_rules(graph, [rule(("Relu", "Relu"), odd, name="odd")], PassContext(), "t")
    assert _sorted(graph) and sorted(ops(graph)) == ["Add", "Add", "Neg", "Sub"]


def test_a_function_check_must_say_why_it_refuses():
    graph = gp.load(_relu_chain(2)).graph
    with pytest.raises(TypeError, match="reason string"):
        apply_rules(graph, [rule(("Relu", "Relu"), lambda m: None, check=lambda m: False, name="mute")], PassContext(), "t")
    ctx = PassContext()
    counts = apply_rules(graph, [rule(("Relu", "Relu"), lambda m: None, check=lambda m: MatchResult.fail("no"), name="r")],
                         ctx, "t")
    assert counts["r"]["refused"] == 1 and ctx.explanations[0].reason == "no" and ops(graph) == ["Relu", "Relu"]


def test_a_tensor_read_inside_an_if_body_is_not_exclusive_to_the_match():
    then = helper.make_graph([helper.make_node("Neg", ["a"], ["q"])], "then", [], [helper.make_tensor_value_info("q", F, [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["n"])], "else", [], [helper.make_tensor_value_info("n", F, [4])])
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                        helper.make_node("If", ["flag"], ["c"], then_branch=then, else_branch=other),
                        helper.make_node("Add", ["b", "c"], ["y"])], {"x": [4], "flag": (TensorProto.BOOL, [])}, {"y": [4]})
    graph = gp.load(model).graph
    assert apply_rules(graph, [ReluRelu()], PassContext(), "t")["relu_relu"]["matched"] == 0
    assert ops(graph) == ["Relu", "Relu", "If", "Add"]

    class Shared(ReluRelu):
        exclusive = False

    assert apply_rules(graph, [Shared()], PassContext(), "t")["shared"]["removed"] == 1  # the outer Relu only
    assert ops(graph) == ["Relu", "Relu", "If", "Add"] and _sorted(graph)
    for flag in (True, False):
        assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIALS[:4], "flag": np.array(flag)}, exact=True)



@pytest.mark.parametrize("rewrite", [
    lambda m: m.anchor.outputs[0],  # "no change": the anchor's own output
    lambda m: m.anchor.inputs[0],   # replaces Split's first output; a second time nobody reads it
])
def test_a_rewrite_that_changes_nothing_is_not_counted_as_fired(rewrite):
    # a rule whose rewrite changed nothing (its own output, or an output nobody reads) was
    # counted as fired and its pass claimed modified=True every round, up to max_rounds
    model = make_model([helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2),
                        helper.make_node("Add", ["a", "b"], ["y"])], {"x": [4]}, {"y": [2]}, opset=18)
    noop = rule_pass("noop_split_rule", RuleSet(rule(("Split",), rewrite, name="noop_split")), kind=PassKind.CLEANUP)
    m = gp.load(model)
    noop()(m)  # the anchor's inputs[0]: rewires Add's 'a' once (a wrong rule, but a change)
    before = [(n.op, [t.name for t in n.inputs]) for n in m.graph.nodes]
    again = noop()(m)
    assert (again.modified, again.stats["fired"], again.stats["refused"]) == (False, 0, 1)
    assert [(n.op, [t.name for t in n.inputs]) for n in m.graph.nodes] == before
    ctx = PassContext()
    noop()(m, ctx)
    assert "changes nothing" in ctx.explanations[-1].reason


def _scope(graph):
    from graphpass.ir.graph import NameGen
    from graphpass.passes.framework.rewrite import Scope

    return Scope(graph, graph, NameGen(graph))


def test_single_reader_and_producer_of_given_ops():
    from graphpass.passes.framework.rewrite import single_reader

    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
                        helper.make_node("Abs", ["b"], ["c"]), helper.make_node("Sin", ["b"], ["d"]),
                        helper.make_node("Cos", ["a"], ["y"])],
                       {"x": [4]}, {"y": [4], "c": [4], "d": [4]})
    graph = gp.load(model).graph
    t = {v.name: v for v in graph.tensors().values()}
    # a: read by Neg and Cos; b: read twice; c: a graph output read by nobody
    assert [single_reader(t[k], graph) for k in ("x", "a", "b", "c")] == [True, False, False, False]
    scope = _scope(graph)
    assert [scope.single_reader(t[k]) for k in ("x", "a", "b", "c")] == [True, False, False, False]
    assert scope.producer(t["b"], "Neg").op == "Neg" and scope.producer(t["b"]).op == "Neg"
    assert scope.producer(t["b"], "Relu", "Abs") is None and scope.producer(t["x"]) is None
    assert scope.producer(t["a"], "Relu", "Neg").op == "Relu"


def test_match_op_names_outputs_and_graph_outputs():
    graph = gp.load(_relu_chain(2)).graph
    graph.nodes[1].name = "last"
    m = Match(list(graph.nodes), graph, _scope(graph).names)  # no graph_outputs given: looked up
    assert m.writes_graph_output()
    out = m.op("Neg", [graph.inputs[0]])
    assert m.created[-1].name.startswith("last_neg") and out.name.startswith("last_neg_out")
    m.op("Neg", [graph.inputs[0]], name="exactly_this")
    assert m.created[-1].name == "exactly_this"
    outs = m.op("Dropout", [graph.inputs[0]], outputs=[True, False])
    assert outs[0].name and outs[1].name == "" and len(m.created[-1].outputs) == 2
    m2 = Match(list(graph.nodes[:1]), graph, _scope(graph).names)
    assert not m2.writes_graph_output()


class _LeakyAlpha(Rule):
    """LeakyRelu -> LeakyRelu(alpha=0.5) through Match.copy (inputs kept, attributes updated)."""

    pattern = ("LeakyRelu",)

    def match(self, anchor, scope):
        m = super().match(anchor, scope)
        return m if m is not None and anchor.attrs.get("alpha") != 0.5 else None

    def rewrite(self, m, ctx):
        return m.copy(m.anchor, attrs={"alpha": 0.5})


def test_match_copy_keeps_name_domain_inputs_and_annotations_and_updates_attributes():
    from graphpass.ir import annotations as A

    model = make_model([helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1, name="lr"), helper.make_node("Neg", ["a"], ["y"])],
                       {"x": [4]}, {"y": [4]})
    graph = gp.load(model).graph
    A.meta(graph.nodes[0])["note"] = "kept"
    counts = apply_rules(graph, [_LeakyAlpha()], PassContext(), "t")
    assert counts["leaky_alpha"]["rewritten"] == 1
    new = graph.nodes[0]
    assert (new.op, new.name, new.domain or "", new.attrs["alpha"]) == ("LeakyRelu", "lr", "", 0.5)
    assert new.inputs[0] is graph.inputs[0] and A.meta(new)["note"] == "kept" and graph.nodes[1].inputs[0] is new.outputs[0]


def test_a_rewrite_building_a_chain_of_new_nodes():
    # Relu(Relu(x)) -> Abs(Neg(x)) ... a created node reads another created node's output
    def rewrite(m):
        return m.op("Relu", [m.op("Relu", [m.nodes[0].inputs[0]])])

    model = _relu_chain(2, out="t")
    model.graph.node.append(helper.make_node("Neg", ["t"], ["y"]))
    model.graph.output[0].name = "y"
    graph = gp.load(model).graph
    apply_rules(graph, [rule(("Relu", "Relu"), rewrite)], PassContext(), "t")
    assert ops(graph) == ["Relu", "Relu", "Neg"] and all(t.name for n in graph.nodes for t in n.outputs)
    assert graph.nodes[1].inputs[0] is graph.nodes[0].outputs[0] and _sorted(graph)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIALS}, exact=True)


def test_tuple_steps_and_follow_none_match_any_listed_op_on_any_input():
    class SigOrTanhThenAdd(Rule):
        pattern = (("Sigmoid", "Tanh"), "Add")
        follow = (None,)

        def rewrite(self, m, ctx):
            return m.op("Sub", [m.nodes[0].inputs[0], m.nodes[0].inputs[0]])

    for op, order in (("Tanh", ["z", "s"]), ("Sigmoid", ["s", "z"])):
        model = make_model([helper.make_node(op, ["x"], ["s"]), helper.make_node("Add", order, ["y"])],
                           {"x": [4], "z": [4]}, {"y": [4]})
        graph = gp.load(model).graph
        counts = apply_rules(graph, [SigOrTanhThenAdd()], PassContext(), "t")
        assert counts["sig_or_tanh_then_add"]["rewritten"] == 1 and ops(graph) == ["Sub"], (op, order)
    model = make_model([helper.make_node("Relu", ["x"], ["s"]), helper.make_node("Add", ["s", "z"], ["y"])],
                       {"x": [4], "z": [4]}, {"y": [4]})
    graph = gp.load(model).graph
    assert apply_rules(graph, [SigOrTanhThenAdd()], PassContext(), "t")["sig_or_tanh_then_add"]["matched"] == 0


def test_a_graph_output_of_unknown_shape_takes_the_rewrites_static_shape():
    model = _relu_chain(2)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", F, None))
    graph = gp.load(model).graph
    graph.outputs[0].shape = None
    apply_rules(graph, [rule(("Relu", "Relu"), lambda m: m.op("Relu", [m.nodes[0].inputs[0]], dtype=np.float32, shape=[8]))],
                PassContext(), "t")
    assert graph.outputs[0].name == "y" and list(graph.outputs[0].shape) == [8]


def test_an_existing_tensor_that_is_another_graph_output_cannot_take_a_graph_outputs_name():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                       {"x": [4]}, {"a": [4], "y": [4]})
    graph = gp.load(model).graph
    ctx = PassContext()
    class RR(Rule):
        name = "rr"
        pattern = ("Relu", "Relu")
        exclusive = False  # the first Relu's output is also a graph output

        def rewrite(self, m, ctx):
            return m.nodes[0].outputs[0]

    counts = apply_rules(graph, [RR()], ctx, "t")
    assert counts["rr"]["refused"] == 1 and ops(graph) == ["Relu", "Relu"]
    assert [t.name for t in graph.outputs] == ["a", "y"] and graph.outputs[0].inputs[0].op == "Relu"
    assert "'y' is a graph output and 'a' cannot take its name" in ctx.explanations[0].reason


def test_an_existing_tensor_replacing_an_internal_one_keeps_its_own_name():
    model = make_model([helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Mul", ["a", "one"], ["b"]),
                        helper.make_node("Abs", ["b"], ["y"])],
                       {"x": [4]}, {"y": [4]}, initializers={"one": np.array(1.0, np.float32)})
    graph = gp.load(model).graph
    apply_rules(graph, [rule(("Mul",), lambda m: m.anchor.inputs[0])], PassContext(), "t")
    assert ops(graph) == ["Neg", "Abs"] and graph.nodes[0].outputs[0].name == "a"
    assert graph.nodes[1].inputs[0] is graph.nodes[0].outputs[0]
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIALS[:4]}, exact=True)


def test_function_rules_are_exclusive_by_default_and_named_after_their_steps():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"]),
                        helper.make_node("Neg", ["a"], ["z"])], {"x": [4]}, {"y": [4], "z": [4]})
    graph = gp.load(model).graph
    counts = apply_rules(graph, [rule(("Relu", "Relu"), lambda m: m.op("Relu", [m.nodes[0].inputs[0]]))], PassContext(), "t")
    assert counts["relu_relu"]["matched"] == 0 and len(graph.nodes) == 3
    r = rule((("Sigmoid", "Tanh"), "Add"), lambda m: m.nodes[0].inputs[0], follow=(None,))
    assert r.label == "sigmoid|tanh_add"


def test_counts_total_a_stat_only_some_rules_counted():
    from graphpass.passes.framework.rewrite import RuleCounts

    counts = RuleCounts()
    counts.entry("a")["merged"] = 2
    counts.entry("b")
    counts.entry("c")["merged"] = 3
    assert counts.total("merged") == 5 and counts.total("rewritten") == 0


def test_a_rule_without_a_pattern_is_tried_at_every_node_in_order_with_the_others():
    class AnyNeg(Rule):
        """No pattern: anchors() is None, so the engine offers it every node."""

        name = "any_neg"

        def match(self, anchor, scope):
            return scope.match([anchor]) if anchor.op == "Neg" else None

        def rewrite(self, m, ctx):
            return m.op("Abs", [m.anchor.inputs[0]])

    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                        helper.make_node("Neg", ["b"], ["y"])], {"x": [4]}, {"y": [4]})
    graph = gp.load(model).graph
    assert AnyNeg().anchors() is None
    counts = apply_rules(graph, [ReluRelu(), AnyNeg()], PassContext(), "t")
    assert counts["any_neg"]["rewritten"] == 1 and counts["relu_relu"]["rewritten"] == 1
    assert ops(graph) == ["Relu", "Abs"] and _sorted(graph)


def test_rule_pass_registers_only_when_asked():
    from graphpass.passes.framework.registry import all_passes

    P = rule_pass("t_not_registered", ReluRelu())
    assert P.name == "t_not_registered" and "t_not_registered" not in all_passes()


def test_a_rewrite_reading_only_a_later_tensor_still_leaves_the_graph_sorted():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                        helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Add", ["b", "n"], ["y"])],
                       {"x": [4]}, {"y": [4]})
    graph = gp.load(model).graph

    def odd(m):  # its one new node reads only n, written after the anchor
        return m.op("Neg", [next(t for t in graph.tensors().values() if t.name == "n")])

    apply_rules(graph, [rule(("Relu", "Relu"), odd, name="odd")], PassContext(), "t")
    assert _sorted(graph) and sorted(ops(graph)) == ["Add", "Neg", "Neg"]


def test_nodes_of_another_domain_are_not_anchors():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"], domain="custom")],
                       {"x": [4]}, {"y": [4]}, extra_opsets={"custom": 1})
    graph = gp.load(model).graph
    assert apply_rules(graph, [ReluRelu()], PassContext(), "t")["relu_relu"]["matched"] == 0 and len(graph.nodes) == 2


def test_a_tensor_of_the_outer_graph_cannot_take_a_branch_outputs_name():
    then = helper.make_graph([helper.make_node("Relu", ["m"], ["p"]), helper.make_node("Relu", ["p"], ["q"])], "then",
                             [], [helper.make_tensor_value_info("q", F, [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["n"])], "else", [], [helper.make_tensor_value_info("n", F, [4])])
    model = make_model([helper.make_node("Neg", ["x"], ["m"]),
                        helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)],
                       {"x": [4], "flag": (TensorProto.BOOL, [])}, {"y": [4]})
    graph = gp.load(model).graph
    ctx = PassContext()
    outer = rule(("Relu", "Relu"), lambda m: next(t for t in m.root.tensors().values() if t.name == "m"), name="outer")
    counts = apply_rules(graph, [outer], ctx, "t")
    assert counts["outer"]["refused"] == 1 and ops(graph.nodes[1].attrs["then_branch"]) == ["Relu", "Relu"]
    assert "'q' is a graph output and 'm' cannot take its name" in ctx.explanations[0].reason
    for flag in (True, False):
        assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIALS[:4], "flag": np.array(flag)}, exact=True)


def test_a_graph_output_keeps_its_symbolic_shape_when_the_rewrite_gives_none():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                       {"x": ["n", 4]}, {"y": ["n", 4]})
    graph = gp.load(model).graph
    apply_rules(graph, [ReluRelu()], PassContext(), "t")
    assert ops(graph) == ["Relu"] and list(graph.outputs[0].shape) == ["n", 4]


def test_lazy_name_gen_reads_no_name_until_asked_and_then_names_as_a_name_gen_would():
    from graphpass.ir.graph import NameGen
    from graphpass.passes.framework.rewrite import LazyNameGen

    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["a__gp1"])],
                       {"x": [4]}, {"a__gp1": [4]})
    graph = gp.load(model).graph
    lazy, eager = LazyNameGen(graph), NameGen(graph)
    assert lazy._gen is None  # building one reads every name of the model: not before a name is asked
    names = [lazy(p) for p in ("a", "a", "b")]
    assert names == [eager(p) for p in ("a", "a", "b")] == ["a__gp2", "a__gp3", "b__gp1"]


def test_rules_sharing_a_label_share_their_counts():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                        helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Neg", ["c"], ["d"]),
                        helper.make_node("Abs", ["d"], ["y"])], {"x": [4]}, {"y": [4]})
    graph = gp.load(model).graph
    twice = [rule(("Relu", "Relu"), lambda m: m.nodes[0].inputs[0], name="double"),
             rule(("Neg", "Neg"), lambda m: m.nodes[0].inputs[0], name="double")]
    counts = apply_rules(graph, twice, PassContext(), "t")
    assert counts["double"]["matched"] == 2 and counts["double"]["rewritten"] == 2 and len(counts) == 1
    assert ops(graph) == ["Abs"] and graph.nodes[0].inputs[0].name == "x"


def test_a_graph_output_taken_over_without_new_nodes_names_later_nodes_as_before():
    """attack14: the anchor that gives all its outputs up at once (rewrite engine, issue 22) must
    leave the walk's names as the per-output detach did: the lazy NameGen is built at the same
    moment (a name of the form P__gpN that the rewrite drops is still taken) and each
    '<output>_old' name is still counted. Before the fix: 't_out__gp1' instead of 't_out__gp2'."""
    model = make_model([helper.make_node("Relu", ["x"], ["t_out__gp1"], name="r"),
                        helper.make_node("Mul", ["t_out__gp1", "one"], ["y"], name="m"),
                        helper.make_node("Neg", ["x"], ["z"], name="n")],
                       {"x": [4]}, {"y": [4], "z": [4]}, {"one": np.ones(4, np.float32)})
    graph = gp.load(model).graph
    times_one = rule(("Mul",), lambda m: m.nodes[0].inputs[0], name="times_one")  # x * 1 -> x: rewires only
    via_identity = rule(("Neg",), lambda m: m.op("Neg", [m.op("Identity", [m.nodes[0].inputs[0]], name="t")]),
                        name="via_identity")
    apply_rules(graph, RuleSet(times_one, via_identity), PassContext(), "t")
    assert [(n.op, n.name, [t.name for t in n.outputs]) for n in graph.nodes] == [
        ("Relu", "r", ["y"]), ("Identity", "t", ["t_out__gp2"]), ("Neg", "n_neg__gp1", ["z"])]
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIALS[:4]}, exact=True)


def test_one_existing_tensor_for_two_graph_outputs_of_the_anchor():
    """attack14: Split(Concat(r, r)) -> (r, r), both halves graph outputs. Each pair's writer is
    decided after the pairs before it moved (the first takes r's producer; the second then finds
    r without a writer and its readers read r): the anchor keeps writing y2. Before the fix the
    writers decided up front made the engine raise ValueError ('r' is not in list)."""
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Concat", ["r", "r"], ["c"], axis=0, name="cat"),
                        helper.make_node("Split", ["c"], ["y1", "y2"], axis=0, num_outputs=2, name="split")],
                       {"x": [4]}, {"y1": [4], "y2": [4]}, opset=18)
    graph = gp.load(model).graph
    halves = rule(("Concat", "Split"), lambda m: (m.nodes[0].inputs[0], m.nodes[0].inputs[1]), name="halves")
    counts = apply_rules(graph, RuleSet(halves), PassContext(), "t")
    assert counts["halves"]["rewritten"] == 1
    assert [(n.op, [t.name for t in n.inputs], [t.name for t in n.outputs]) for n in graph.nodes] == [
        ("Relu", ["x"], ["y1"]), ("Concat", ["y1", "y1"], ["c"]), ("Split", ["c"], ["y1_old__gp1", "y2"])]
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIALS[:4]}, exact=True)


def test_a_rewrite_that_swaps_two_outputs_of_the_anchor_swaps_their_readers():
    """attack14 (left on main): a rule whose rewrite gives the anchor's two outputs back swapped
    (readers of the first read the second, and the other way round). Rewired pair by pair, the
    second pair moved back the readers the first had just moved: Sub(a, b) became Sub(a, a)."""
    model = make_model([helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2, name="split"),
                        helper.make_node("Sub", ["a", "b"], ["y"], name="sub")],
                       {"x": [4]}, {"y": [2]}, opset=18)
    graph = gp.load(model).graph
    swap = rule(("Split",), lambda m: (m.nodes[0].outputs[1], m.nodes[0].outputs[0]), name="swap")
    counts = apply_rules(graph, RuleSet(swap), PassContext(), "t")
    assert counts["swap"]["rewritten"] == 1
    assert [(n.op, [t.name for t in n.inputs], [t.name for t in n.outputs]) for n in graph.nodes] == [
        ("Split", ["x"], ["a", "b"]), ("Sub", ["b", "a"], ["y"])]
    x = np.array([1.0, -0.0, np.nan, np.inf], np.float32)
    got = ort_run(gp.to_proto(graph), {"x": x})["y"]
    np.testing.assert_array_equal(got, x[2:] - x[:2])


def test_a_swap_of_outputs_one_a_graph_output_is_refused_and_leaves_the_graph():
    model = make_model([helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2, name="split"),
                        helper.make_node("Sub", ["a", "b"], ["y"], name="sub")],
                       {"x": [4]}, {"y": [2], "a": [2]}, opset=18)
    graph = gp.load(model).graph
    swap = rule(("Split",), lambda m: (m.nodes[0].outputs[1], m.nodes[0].outputs[0]), name="swap")
    counts = apply_rules(graph, RuleSet(swap), PassContext(), "t")
    assert counts["swap"]["rewritten"] == 0 and counts["swap"]["refused"] == 1
    assert [(n.op, [t.name for t in n.inputs], [t.name for t in n.outputs]) for n in graph.nodes] == [
        ("Split", ["x"], ["a", "b"]), ("Sub", ["a", "b"], ["y"])]
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.array([1.0, -0.0, np.nan, np.inf], np.float32)},
                      exact=True)


def _reuse_model():
    """x -> Sub(x, c) 's' -> t -> LeakyRelu 'lr' -> y; Abs 'u' (also reading x, placed between s and
    lr) -> z; the Sub annotated: a copy of s, with its inputs swapped, takes lr's place."""
    model = make_model([helper.make_node("Sub", ["x", "c"], ["t"], name="s"), helper.make_node("Abs", ["x"], ["z"], name="u"),
                        helper.make_node("LeakyRelu", ["t"], ["y"], name="lr", alpha=0.5),
                        helper.make_node("Neg", ["x"], ["w"], name="v")],
                       {"x": [4]}, {"y": [4], "z": [4], "w": [4]}, {"c": np.arange(4, dtype=np.float32)})
    graph = gp.load(model).graph
    from graphpass.ir import annotations as A

    A.meta(graph.nodes[0])["note"] = "kept"
    return graph


def _swap_copy(reuse: bool) -> Rule:
    return rule(("Sub", "LeakyRelu"), lambda m: m.copy(m.nodes[0], inputs=m.nodes[0].inputs[::-1], reuse=reuse),
                name="swap")


def _layout(graph: gs.Graph) -> list:
    """Every node's op, name, attributes, annotations and wiring by tensor name, and each tensor's
    readers and writers by node name, in order (the undo log and later passes see the order)."""
    from graphpass.ir import annotations as A

    out = []
    for n in graph.nodes:
        out.append((n.op, n.name, dict(n.attrs), A.stored_meta(n), [t.name for t in n.inputs], [t.name for t in n.outputs]))
        for t in [*n.inputs, *n.outputs]:
            out.append((t.name, [p.name for p in t.inputs], [r.name for r in t.outputs]))
    return out


def test_a_copy_with_reuse_edits_the_matched_node_to_the_graph_a_copy_makes():
    """copy(node, reuse=True): the engine edits the Sub itself (its inputs, its attributes dict; it
    writes the anchor's output and moves to the anchor's place) instead of building a copy and
    dropping it: the same exported bytes, node order, readers' order, annotations, counts and
    later names as the copy."""
    graphs, counts = [], []
    for reuse in (False, True):
        graph = _reuse_model()
        sub = graph.nodes[0]
        counts.append(apply_rules(graph, RuleSet(_swap_copy(reuse), rule(("Neg",), lambda m: m.op("Neg", [
            m.nodes[0].inputs[0]]), name="neg")), PassContext(), "t"))
        assert ops(graph) == ["Abs", "Sub", "Neg"] and (graph.nodes[1] is sub) == reuse
        graphs.append(graph)
    assert gp.to_proto(graphs[0]).SerializeToString() == gp.to_proto(graphs[1]).SerializeToString()
    assert _layout(graphs[0]) == _layout(graphs[1]) and counts[0] == counts[1]
    assert counts[1]["swap"] == {"matched": 1, "refused": 0, "rewritten": 1, "removed": 2, "created": 1}
    assert graphs[1].nodes[1].inputs[0].name == "c" and graphs[1].nodes[1].outputs[0].name == "y"
    assert graphs[1].nodes[2].name == "v_neg__gp1"  # the names the copy asked are asked: later names as before


def test_a_copy_with_reuse_rolls_back_exactly():
    from graphpass.ir import model_io
    from graphpass.ir.journal import Journal

    graph = _reuse_model()
    before = model_io.to_proto(graph, emit="device").SerializeToString()
    wiring = _layout(graph)
    ids = [(id(n), [id(t) for t in n.inputs], [id(t) for t in n.outputs]) for n in graph.nodes]
    with Journal(graph) as j:
        apply_rules(graph, [_swap_copy(True)], PassContext(), "t")
    assert ops(graph) == ["Abs", "Sub", "Neg"]
    j.rollback()
    assert model_io.to_proto(graph, emit="device").SerializeToString() == before and _layout(graph) == wiring
    assert [(id(n), [id(t) for t in n.inputs], [id(t) for t in n.outputs]) for n in graph.nodes] == ids


def test_a_copy_with_reuse_of_a_node_read_elsewhere_is_a_copy():
    """The Sub's output also read by another node (a match that is not exclusive): the Sub stays
    for that reader, so a copy is built, as without reuse."""
    graph = _reuse_model()
    sub, t = graph.nodes[0], graph.nodes[0].outputs[0]
    graph.nodes[1].inputs[0] = t  # Abs reads the Sub's output too
    rules = [rule(("Sub", "LeakyRelu"), lambda m: m.copy(m.nodes[0], inputs=m.nodes[0].inputs[::-1], reuse=True),
                  exclusive=False)]
    counts = apply_rules(graph, rules, PassContext(), "t")
    assert counts.total("rewritten") == 1 and ops(graph) == ["Sub", "Abs", "Sub", "Neg"]
    assert graph.nodes[0] is sub and sub.outputs[0] is t and graph.nodes[2] is not sub


def test_a_copy_with_reuse_whose_output_is_used_otherwise_is_a_rule_bug_and_leaves_the_graph():
    graph = _reuse_model()
    before = gp.to_proto(graph).SerializeToString()
    bad = rule(("Sub", "LeakyRelu"), lambda m: m.op("Neg", [m.copy(m.nodes[0], reuse=True)]), name="bad")
    with pytest.raises(TypeError, match="reused in place"):
        apply_rules(graph, [bad], PassContext(), "t")
    assert gp.to_proto(graph).SerializeToString() == before
