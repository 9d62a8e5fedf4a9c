import { Component, type ComponentChildren } from "preact";

interface Props {
  /** The panel's section id, kept on the error so tests and styles find it where the panel was. */
  id: string;
  title: string;
  children: ComponentChildren;
}

/**
 * An error boundary around one panel: a fault while the panel renders (or in
 * its effects, such as a chart that cannot draw) shows up as an error in that
 * panel's place, and the other panels go on rendering and polling.
 */
export class Panel extends Component<Props, { fault: string | null }> {
  override state = { fault: null as string | null };

  static override getDerivedStateFromError(err: unknown): { fault: string } {
    return { fault: err instanceof Error ? `${err.name}: ${err.message}` : String(err) };
  }

  override componentDidCatch(err: unknown): void {
    // Left in the console too, with the stack a bug report needs.
    console.error(`dashboard panel ${this.props.id} failed`, err);
  }

  override render() {
    if (this.state.fault === null) return this.props.children;
    return (
      <section id={this.props.id}>
        <h2>{this.props.title}</h2>
        <p class="error panel-fault" role="alert">
          This panel failed to render: {this.state.fault}. The rest of the page is unaffected.{" "}
          <button type="button" onClick={() => this.setState({ fault: null })}>
            Try again
          </button>
        </p>
      </section>
    );
  }
}
